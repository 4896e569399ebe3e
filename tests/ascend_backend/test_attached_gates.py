"""Attached gates say what ran (issue 40, finding 2): "N of M split-path cases ran", and zero
fails an --afd-require-hardware session. Real HTTP against the harness's CPU servers."""

from __future__ import annotations

import json

import pytest

from pytest_afd.gate_runs import needs_of
from tests.ascend_backend.test_ascend_deployments import (
    CASES,
    DEPLOYMENT_VARIABLES,
    TOPOLOGY,
    cpu_servers,
    entry,
)

pytest_plugins = ["pytester"]

GATES = CASES + """
@pytest.mark.gate
def test_split_path(afd_backend):
    run(afd_backend, "token_balanced")
    run(afd_backend, "none")  # the reference: skips when no split-none deployment serves it

@pytest.mark.gate
def test_fail_closed_check():
    pass

def test_measured_elsewhere(afd_backend):  # not a gate: meets --afd-allow-emulated's ledger
    run(afd_backend, "token_balanced")
"""
ARGS = ("--afd-backend", "vllm-ascend", "--npu-topology", TOPOLOGY, "--afd-require-hardware",
        "--afd-allow-emulated", "-p", "no:cacheprovider")


@pytest.fixture
def no_deployment(monkeypatch):
    for name in DEPLOYMENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def gate_runs(pytester) -> dict:
    return json.loads((pytester.path / "afd-results" / "summary.json").read_text())["gate_runs"]


def test_zero_split_path_cases_ran_is_said_and_fails(pytester, tmp_path, no_deployment):
    with cpu_servers(tmp_path, "token_balanced") as servers:
        listing = tmp_path / "deployments.json"
        listing.write_text(json.dumps([entry(servers.servers[0].base_url, "token_balanced")]))
        no_deployment.setenv("AFD_ASCEND_DEPLOYMENTS", str(listing))
        pytester.makepyfile(GATES)
        result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=2, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "gate: 0 of 1 split-path cases ran against the deployment; the others need a second, "
        "split-none reference deployment (split_policy='none'; gate 1's reference) (1); "
        "afd-launch-plan --for-gates prints*; --afd-require-hardware: failing the session*"])
    found = gate_runs(pytester)
    assert (found["split_path_cases"], found["split_path_ran"]) == (1, 0)
    assert found["fails_session"] is True


def test_with_the_split_none_deployment_the_case_runs_and_passes(pytester, tmp_path,
                                                                 no_deployment):
    with cpu_servers(tmp_path, "token_balanced", "none") as servers:
        balanced, none = servers.servers
        listing = tmp_path / "deployments.json"
        listing.write_text(json.dumps([entry(balanced.base_url, "token_balanced"),
                                       entry(none.base_url, "none")]))
        no_deployment.setenv("AFD_ASCEND_DEPLOYMENTS", str(listing))
        pytester.makepyfile(GATES)
        result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=3)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["gate: 1 of 1 split-path cases ran against the deployment"])
    assert gate_runs(pytester)["ran_cases"][0].endswith("::test_split_path")


def test_skip_reasons_become_what_the_cases_need():
    reason = ("the backend cannot run this case: no deployment in $X serves dp3pcp8-ep8 model "
              "'reduced' with settings {...}; the nearest, http://h:1, differs in (deployment, "
              "case) {'routing': ('forced_balanced', 'natural'), 'max_num_seqs': (32, 8)}: "
              "deploy one with these settings (pytest --afd-list-deployments lists them)")
    assert needs_of(reason) == ["routing='natural'", "max_num_seqs=8"]
    assert needs_of("backend 'vllm-ascend' runs the one deployment of this session; this case "
                    "needs --afd-model full (this session: reduced): run it") == [
        "a session with --afd-model full"]
    assert needs_of(None) == ["no reason given"]
