"""Attached gates say what ran (issue 40, finding 2): "N of M split-path cases ran", and zero
fails an --afd-require-hardware session. Real HTTP against the harness's CPU servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pytest_afd.core.backend import RunSettings
from pytest_afd.run.gate_runs import needs_of
from pytest_afd.serving.http_backend import cpu_server_spec
from pytest_afd.serving.lifecycle import ServerGroup
from tests.support.ascend_deployments import (
    CASES,
    DEPLOYMENT_VARIABLES,
    REPO,
    TOPOLOGY,
    entry,
)
from tests.support.inner_pytest import UNRELATED_PLUGINS

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


def test_zero_split_path_cases_ran_is_said_and_fails(pytester, tmp_path, no_deployment,
                                                     policy_servers):
    listing = tmp_path / "deployments.json"
    listing.write_text(json.dumps([entry(policy_servers["token_balanced"].base_url,
                                         "token_balanced")]))
    no_deployment.setenv("AFD_ASCEND_DEPLOYMENTS", str(listing))
    pytester.makepyfile(GATES)
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=2, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "gate: 0 of 1 split-path cases ran against the deployment; the others need a second, "
        "split-none reference deployment (split_policy='none'; gate 1's reference) (1); "
        "pytest-afd launch-plan --for-gates prints*; --afd-require-hardware: failing the session*"])
    found = gate_runs(pytester)
    assert (found["split_path_cases"], found["split_path_ran"]) == (1, 0)
    assert found["fails_session"] is True


def test_a_hardware_backend_fails_the_session_without_require_hardware_too(
        pytester, tmp_path, no_deployment, policy_servers):
    """A user's plain ``pytest -m gate --afd-backend vllm-ascend`` against a deployment no
    split-path case can run on ends red, not green on the pure checks alone."""
    listing = tmp_path / "deployments.json"
    listing.write_text(json.dumps([entry(policy_servers["token_balanced"].base_url,
                                         "token_balanced")]))
    no_deployment.setenv("AFD_ASCEND_DEPLOYMENTS", str(listing))
    pytester.makepyfile(GATES)
    result = pytester.runpytest(*(arg for arg in ARGS if arg != "--afd-require-hardware"))
    result.assert_outcomes(passed=2, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "gate: 0 of 1 split-path cases ran against the deployment;*"
        "on a hardware backend: failing the session (no split-path case ran)"])
    # The last line names the reason this session failed for, not a flag it was not given.
    final = [line for line in result.outlines if "pytest-afd: session failed" in line]
    assert len(final) == 1 and "on a hardware backend: 0 of 1 split-path gate cases" in final[0]
    assert "--afd-require-hardware" not in final[0]
    assert gate_runs(pytester)["fails_session"] is True


def test_with_the_split_none_deployment_the_case_runs_and_passes(pytester, tmp_path,
                                                                 no_deployment, policy_servers):
    balanced, none = policy_servers["token_balanced"], policy_servers["none"]
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


@pytest.mark.slow
def test_gate_1_runs_on_the_for_gates_deployments(tmp_path, no_deployment):
    """``afd-launch-plan --for-gates``'s two deployments (CPU servers at its settings), attached
    through its AFD_ASCEND_DEPLOYMENTS entries: gate 1's one_long_request case runs its
    candidate on the split deployment and its reference on the split-none one, and passes."""
    nodes = [arg for index in range(1, 5) for arg in ("--node-address", f"10.0.0.{index}")]
    plan = subprocess.run(
        [sys.executable, "-m", "pytest_afd.backends.vllm_ascend.launch", "--npu-topology",
         TOPOLOGY, "--model", "/m", "--devices-per-node", "16", *nodes, "--nic-name", "eth0",
         "--for-gates", "--json"], cwd=REPO, capture_output=True, text=True, check=True)
    entries = json.loads(plan.stdout)["AFD_ASCEND_DEPLOYMENTS"]
    specs = [cpu_server_spec(RunSettings(**item["settings"]), name=item["settings"]["split_policy"],
                             log_dir=tmp_path, topology=TOPOLOGY, model_name="reduced", seed=0)
             for item in entries]
    with ServerGroup(specs, tmp_path) as group:
        listing = tmp_path / "deployments.json"
        listing.write_text(json.dumps([{**item, "url": server.base_url}
                                       for item, server in zip(entries, group.servers, strict=True)]))
        env = {**os.environ, "PYTHONPATH": str(REPO), "AFD_ASCEND_DEPLOYMENTS": str(listing)}
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *UNRELATED_PLUGINS, "-q",
             "-m", "gate", "suites/gates/test_gate_1_token_split.py", "-k",
             "token_balanced_matches_unsplit and one_long_request and none",
             "--afd-backend", "vllm-ascend", "--npu-topology", TOPOLOGY, "--afd-require-hardware",
             "--afd-allow-emulated", "--afd-results-dir", str(tmp_path / "results")],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "gate: 1 of 1 split-path cases ran against the deployment" in run.stdout, run.stdout[-3000:]
