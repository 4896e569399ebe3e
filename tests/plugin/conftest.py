"""Fixtures of the plugin tests (helpers they share live in tests/support/plugin_pytester.py)."""

import pytest

from tests.support.plugin_pytester import AFD_ENV, FAKE_CONFTEST


@pytest.fixture
def fake(pytester, monkeypatch, tmp_path):
    """A pytester project whose conftest is the fake backend, with the AFD settings unset."""
    monkeypatch.setenv("FAKE_CLOSED_FILE", str(tmp_path / "closed.txt"))
    for name in AFD_ENV:
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(FAKE_CONFTEST)
    return pytester
