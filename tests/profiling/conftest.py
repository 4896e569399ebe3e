"""Profiling fixtures: the committed ascend_pt fixtures analysed once per test run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import fixture_analysis

DATA = Path(__file__).with_name("data")
ROLE_DIRS = {"attention": DATA / "attention", "ffn": DATA / "ffn"}


@pytest.fixture(scope="session")
def fixture_analysis_session(tmp_path_factory) -> fixture_analysis.FixtureAnalysis:
    """The real ``ascend.analyse`` of both fixture roles (msprof-analyze run once per role),
    shared by the run's xdist workers: their temporary directories are siblings under the
    run's own, which a plain run does not share with other runs, so it keeps its own."""
    pytest.importorskip("msprof_analyze", reason="msprof-analyze not installed (extra [profile])")
    base = tmp_path_factory.getbasetemp()
    run_dir = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return fixture_analysis.record_once(ROLE_DIRS, run_dir / "msprof-fixtures")


@pytest.fixture
def reused_msprof(fixture_analysis_session):
    """For one test, msprof-analyze answers the fixture roles from the session's real output
    (tests/support/fixture_analysis.py); ``reused`` lists the directories it answered."""
    fixture_analysis_session.reused.clear()
    with fixture_analysis_session.reusing() as analysis:
        yield analysis
