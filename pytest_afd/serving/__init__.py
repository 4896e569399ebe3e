"""Serving: an OpenAI-style HTTP server for any backend, the streaming benchmark
client, server lifecycle, Prometheus counters and ``vllm bench serve`` import.

Submodules are imported directly (``pytest_afd.serving.client`` ...) so that
importing this package pulls in neither torch nor an HTTP server.
"""
