"""Root conftest: project-wide test settings (the plugin itself loads via its entry point)."""

import hypothesis  # noqa: F401  (kept loaded: see below)
import torch

# Two cores here and in CI: keep each test process to a single intra-op thread
# so pytest-xdist workers and the AFD runtime's processes do not oversubscribe.
torch.set_num_threads(1)

# pytester's in-process runs restore sys.modules afterwards, and hypothesis's pytest plugin
# imports hypothesis in every session's terminal summary: unless this process already holds
# it, each such run re-imports all of hypothesis (and re-rewrites its asserts, ~1 s, where
# PYTHONDONTWRITEBYTECODE keeps pytest from caching the rewrite).
