"""afd_split inside engines: the per-step glue and the worker evidence writer.

``engine_step`` is what every engine path calls once per prefill step (the
AFD-plugin hook on Ascend and the harness's CPU backend alike), so the CPU gates
cover the same functions the hook runs. ``worker_evidence`` appends one JSON
line per step and rank. ``afd_plugin`` is the vLLM general plugin that routes
the AFD plugin's async-MoE stage planning through afd_split; it imports vLLM,
vLLM-Ascend and afd_plugin only inside functions.
"""
