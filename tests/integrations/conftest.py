"""Fixtures of the engine-integration tests (stand-ins live in hook_standins.py)."""

import sys

import pytest

from tests.support.hook_standins import load_standin_plugin


@pytest.fixture
def standin_plugin(tmp_path):
    """Factory: PluginSeams over freshly loaded stand-in modules of a branch."""
    loaded = []

    def build(branch: str = "main", header_overrides=None):
        seams = load_standin_plugin(tmp_path / f"{branch.replace('/', '_')}_{len(loaded)}",
                                    branch, header_overrides)
        loaded.extend([seams.validation_module.__name__, seams.runner_module.__name__,
                       seams.forward_module.__name__])
        return seams

    yield build
    for name in loaded:
        sys.modules.pop(name, None)


def pytest_configure(config):
    """``slow`` is registered by the afd plugin; the optional real-vLLM run uses ``-p no:afd``."""
    config.addinivalue_line("markers", "slow: long-running; deselected by default")
