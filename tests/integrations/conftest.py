"""Fixtures of the engine-integration tests (stand-ins live in hook_standins.py)."""

import sys

import pytest

from tests.support.hook_standins import load_standin_plugin, register_standins


@pytest.fixture
def standin_plugin(tmp_path, monkeypatch):
    """Factory: freshly loaded stand-in modules of a branch, registered under the pinned
    module names with a seam-hook-free ``sys.meta_path`` (each call: a fresh worker), so
    ``install.install_deferred`` installs the hook on them as registration does."""
    loaded = []

    def build(branch: str = "main", header_overrides=None):
        plugin = load_standin_plugin(tmp_path / f"{branch.replace('/', '_')}_{len(loaded)}",
                                     branch, header_overrides)
        loaded.extend(module.__name__ for module in plugin.by_pinned_name().values())
        register_standins(monkeypatch, plugin.by_pinned_name())
        return plugin

    yield build
    for name in loaded:
        sys.modules.pop(name, None)


def pytest_configure(config):
    """``slow`` is registered by the afd plugin; the optional real-vLLM run uses ``-p no:afd``."""
    config.addinivalue_line("markers", "slow: long-running; deselected by default")
