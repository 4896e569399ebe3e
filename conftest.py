"""Root conftest: project-wide test settings (the plugin itself loads via its entry point)."""

import torch

# Two cores here and in CI: keep each test process to a single intra-op thread
# so pytest-xdist workers and the AFD runtime's processes do not oversubscribe.
torch.set_num_threads(1)
