"""The listing prices a frozen study's protocol (issue 43, item 1: "and the study file when there is one").

Under ``--afd-study`` the estimate's warmups and repetitions are the study's, not the
session's defaults, and the listing names the study it priced.
"""

from __future__ import annotations

import json

import pytest

from tests.study.study_helpers import freeze
from tests.support.ascend_deployments import (
    CASES,
    DECLARING_CONFTEST,
    DEPLOYMENT_VARIABLES,
    TOPOLOGY,
)

pytest_plugins = ["pytester"]

STUDY_WARMUPS = 2
STUDY_REPETITIONS = 5
STEP_S = 140_000 / (6688 * 32)  # the recipe's step on 32 NPUs (afd_split.plan.npu_step)
DEPLOY_S = 60.0


@pytest.fixture
def listing(pytester, monkeypatch):
    for name in DEPLOYMENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(DECLARING_CONFTEST)
    pytester.makepyfile(CASES + """
@pytest.mark.afd_deployments("none", "token_balanced")
def test_pair(afd_backend):
    run(afd_backend, "none")
""")

    def run_listing(*extra: str) -> dict:
        result = pytester.runpytest("--afd-backend", "vllm-ascend", "--npu-topology", TOPOLOGY,
                                    "--afd-devices-per-node", "16", "-p", "no:cacheprovider",
                                    "--afd-deploy-time-s", str(DEPLOY_S), "--afd-list-deployments",
                                    *extra)
        assert result.ret == 0, result.stdout.str()[-2000:] + result.stderr.str()[-2000:]
        document = json.loads((pytester.path / "afd-results" / "deployments.json").read_text())
        return {"estimate": document["estimated_device_time"], "stderr": result.stderr.str()}

    return run_listing


def test_listing_prices_the_studys_protocol_and_names_the_study(listing, tmp_path):
    study = freeze(tmp_path, "--warmups", str(STUDY_WARMUPS),
                   "--repetitions", str(STUDY_REPETITIONS))
    found = listing("--afd-study", str(tmp_path / "s.json"))
    estimate = found["estimate"]
    assert (estimate["warmups"], estimate["repetitions"]) == (
        STUDY_WARMUPS, {"low": STUDY_REPETITIONS, "high": STUDY_REPETITIONS})
    assert estimate["device_s"]["low"] == pytest.approx(
        2 * DEPLOY_S + 2 * (STUDY_WARMUPS + STUDY_REPETITIONS) * STEP_S)
    assert study["digest"] in estimate["protocol_source"]
    assert f"repetitions from the study 's' ({study['digest']}) protocol" in found["stderr"]


def test_without_a_study_the_session_options_are_priced(listing):
    estimate = listing("--afd-repeats", "4", "--afd-warmups", "0")["estimate"]
    assert (estimate["warmups"], estimate["repetitions"]["low"]) == (0, 4)
    assert estimate["protocol_source"] == "session options"
    assert estimate["device_s"]["low"] == pytest.approx(2 * DEPLOY_S + 2 * 4 * STEP_S)
