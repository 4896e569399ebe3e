"""Root conftest: project-wide test settings (the plugin itself loads via its entry point)."""

import contextlib

import pytest
import torch

from tests.support.fork_server import ForkServer

# Two cores here and in CI: keep each test process to a single intra-op thread
# so pytest-xdist workers and the AFD runtime's processes do not oversubscribe.
torch.set_num_threads(1)

# pytester's in-process runs restore sys.modules afterwards, and hypothesis's pytest plugin
# imports hypothesis in every session's terminal summary: unless this process already holds
# it, each such run re-imports all of hypothesis (and re-rewrites its asserts, ~1 s, where
# PYTHONDONTWRITEBYTECODE keeps pytest from caching the rewrite). Optional: the real-vLLM
# environments (requirements-vllm.txt) do not install hypothesis.
with contextlib.suppress(ImportError):
    import hypothesis  # noqa: F401


@pytest.fixture(scope="session")
def fork_server():
    """Fresh Python processes without a new interpreter importing torch each: children forked
    from one server that imported only torch and numpy (tests/support/fork_server.py). One
    per session (each xdist worker its own), started on first use, ended at teardown."""
    server = ForkServer()
    yield server
    server.close()
