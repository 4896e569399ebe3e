"""pytest-afd: correctness and performance harness for AFD prefill dual batching."""
