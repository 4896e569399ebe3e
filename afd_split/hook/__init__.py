"""The AFD-plugin hook: ``async_moe_split="token_balanced"`` routed through afd_split.

Layers, bottom up (each imports only those below it; import-linter checks them in
the default test run, pyproject ``[tool.importlinter]``):

* ``facts``: the pinned upstream headers, the drift checks, ``PATCH_MARKER``,
  ``installed_branch``, ``PluginDriftError`` and the drift log;
* ``planning``: per-step planning and its evidence (``engine_step``, which the
  harness's CPU backend calls too, ``stages``, the support ``rules``, the evidence
  writer and the expert-load recorder);
* ``glue``: the runner glue (the PCP stage seam, builder-owned state, dispatched
  rows, the runner-level token_balanced step, the runner's session);
* ``patches``: one file per upstream target, never importing each other;
* ``install``: the vLLM ``general_plugins`` entry point and the one install path
  (``install_deferred``), the only importer of ``patches``.

Nothing here imports vLLM, vLLM-Ascend or afd_plugin at import time.
"""
