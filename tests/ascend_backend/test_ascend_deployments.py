"""Deployments: the file of them, the deploy command, the listing, and errors that never read green.

CPU servers (``python -m pytest_afd.serving.server``) stand in for the
deployments; every test runs real HTTP. The slow end-to-end runs (Stage A from
the listing, stages A-F and the gate phases through the deploy command) are in
``test_ascend_deployments_e2e.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pytest_afd.backends.vllm_ascend.deployments import (
    LAUNCH_FIELDS,
    DeploymentConfigError,
    load_deployments,
    parse_deployments,
)
from pytest_afd.core.backend import RunSettings
from pytest_afd.serving import cpu_deploy
from pytest_afd.serving.engine import DEFAULT_BATCH_WINDOW_S
from pytest_afd.serving.http_backend import server_side_settings
from tests.support.ascend_deployments import (
    CASES,
    DECLARING_CONFTEST,
    DEPLOYMENT_VARIABLES,
    REPO,
    SMALL,
    TOPOLOGY,
    entry,
)
from tests.support.inner_pytest import UNRELATED_PLUGINS

pytest_plugins = ["pytester"]

CPU_DEPLOY = f"{sys.executable} -m pytest_afd.cli deploy-cpu"


@pytest.fixture
def no_deployment(monkeypatch):
    for name in DEPLOYMENT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def settings(policy: str) -> RunSettings:
    return server_side_settings(RunSettings(split_policy=policy, **SMALL), LAUNCH_FIELDS)


# -- the file ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "not JSON"),
    ("[]", "non-empty JSON list"),
    ('[{"url": "http://h:1"}]', "entry 0: expected an object with 'url' and 'settings'"),
    ('[{"url": "ftp://h", "settings": {}}]', "entry 0: url 'ftp://h' is not http"),
    ('[{"url": "http://h:1", "settings": {"split": "none"}}]', "unknown RunSettings fields ['split']"),
    ('[{"url": "http://h:1", "settings": {"split_policy": "both"}}]', "split_policy='both'"),
    ('[{"url": "http://h:1", "settings": {}, "nodes": 2}]', "unknown keys ['nodes']"),
])
def test_bad_deployments_file_names_the_variable_file_and_entry(tmp_path, text, message):
    path = tmp_path / "deployments.json"
    path.write_text(text)
    with pytest.raises(DeploymentConfigError) as raised:
        load_deployments(str(path))
    assert f"$AFD_ASCEND_DEPLOYMENTS={path}" in str(raised.value)
    assert message in str(raised.value)


def test_unreadable_deployments_file_is_named(tmp_path):
    with pytest.raises(DeploymentConfigError, match=r"AFD_ASCEND_DEPLOYMENTS=.*missing.json: cannot read"):
        load_deployments(str(tmp_path / "missing.json"))


def test_entry_settings_keep_only_launch_fields():
    item = entry("http://h:1", "none")
    item["settings"].update(split_align=8, return_logits=True)
    [deployment] = parse_deployments(json.dumps([item]), "src")
    assert deployment.settings == settings("none")


# -- attach to several ---------------------------------------------------------------------------
def test_each_case_goes_to_its_deployment_and_a_missing_one_skips(pytester, tmp_path, no_deployment,
                                                                  policy_servers):
    """Two CPU servers, three policies: two cases measured on the right server, one skipped by name.

    The plan file an entry names gives the manifest its nodes and devices per node
    (2 x 16, not the default 8 per node) and the server says it is a CPU stand-in.
    """
    plan = tmp_path / "plan.json"
    subprocess.run([sys.executable, "-m", "pytest_afd.backends.vllm_ascend.launch", "--npu-topology",
                    TOPOLOGY, "--model", "/models/ds", "--devices-per-node", "16", "--node-address",
                    "10.0.0.1", "--node-address", "10.0.0.2", "--nic-name", "eth0", "--json"],
                   check=True, stdout=plan.open("w"), cwd=REPO)
    none, balanced = policy_servers["none"], policy_servers["token_balanced"]
    listing = tmp_path / "deployments.json"
    listing.write_text(json.dumps([entry(none.base_url, "none", plan=str(plan)),
                                   entry(balanced.base_url, "token_balanced", plan=str(plan))]))
    no_deployment.setenv("AFD_ASCEND_DEPLOYMENTS", str(listing))
    pytester.makepyfile(CASES + """
def test_none(afd_backend):
    run(afd_backend, "none")
    assert afd_backend._session.base_url == "NONE_URL"

def test_balanced(afd_backend):
    run(afd_backend, "token_balanced")
    assert afd_backend._session.base_url == "BALANCED_URL"

def test_request_boundary(afd_backend):
    run(afd_backend, "request_boundary")

def test_manifest(afd_manifest):
    hardware = afd_manifest["hardware"]
    assert (hardware["node_count"], hardware["devices_per_node"]) == (2, 16)
    assert hardware["emulated"] is True and hardware["device_type"].startswith("cpu")
    assert afd_manifest["model"]["num_layers"] >= 1
    assert afd_manifest["model"]["execution_mode"].startswith("eager")
""".replace("NONE_URL", none.base_url).replace("BALANCED_URL", balanced.base_url))
    result = pytester.runpytest("--afd-backend", "vllm-ascend", "--npu-topology", TOPOLOGY,
                                "-p", "no:cacheprovider", "-rs")
    assert none.poll() is None and balanced.poll() is None, "attach mode never stops deployments"
    result.assert_outcomes(passed=3, skipped=1)
    result.stdout.fnmatch_lines([
        "*no deployment for this case: no deployment in $AFD_ASCEND_DEPLOYMENTS=*serves "
        f"{TOPOLOGY} model 'reduced' with settings*\"split_policy\": \"request_boundary\"*"
        "differs in (deployment, case) {'split_policy': (*, 'request_boundary')}*"])
    assert "Traceback" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*0 cases measured on hardware*; 2 ran on a pytest-afd server*"])


def test_attached_stand_in_is_never_hardware_and_a_skipped_case_is_not_measured(
        pytester, no_deployment, policy_servers):
    """Issue 40, finding 1: the harness's CPU server attached through AFD_ASCEND_SERVER_URL
    is a stand-in (it labels itself; the client reads the label even after the case dropped
    its session), and a case that ran then skipped (no split-none deployment for its
    reference) counts as measured nowhere: --afd-require-hardware fails the session."""
    balanced = policy_servers["token_balanced"]
    no_deployment.setenv("AFD_ASCEND_SERVER_URL", balanced.base_url)
    no_deployment.setenv("AFD_ASCEND_SERVER_SETTINGS",
                         json.dumps({"split_policy": "token_balanced", **SMALL}))
    pytester.makepyfile(CASES + """
def test_reference_missing(afd_backend):  # first: the label is asked after its session is gone
    run(afd_backend, "token_balanced")
    run(afd_backend, "none")  # no split-none deployment: the case skips

def test_measured(afd_backend):
    run(afd_backend, "token_balanced")
""")
    result = pytester.runpytest("--afd-backend", "vllm-ascend", "--npu-topology", TOPOLOGY,
                                "--afd-require-hardware", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*0 cases measured on hardware*; 1 ran on a pytest-afd server*"
                                 "(device cpu)*failing the session*"])
    hardware = json.loads((pytester.path / "afd-results" / "summary.json").read_text())["hardware"]
    assert hardware["cases_measured_on_hardware"] == 0 and hardware["cases_on_stand_in"] == 1
    assert hardware["stand_in_device"] == "cpu" and hardware["fails_session"] is True
    assert [case.split("::")[-1] for case in hardware["skipped_after_runs"]] == [
        "test_reference_missing"]


def test_dead_deployment_is_one_session_error_naming_it(pytester, no_deployment):
    no_deployment.setenv("AFD_ASCEND_SERVER_URL", "http://127.0.0.1:9")  # discard port: refused
    no_deployment.setenv("AFD_ASCEND_SERVER_SETTINGS", json.dumps({"split_policy": "none"}))
    pytester.makepyfile("""
def test_pure():
    pass

def test_one(afd_backend):
    pass

def test_two(afd_backend):
    pass
""")
    result = pytester.runpytest("--afd-backend", "vllm-ascend", "-p", "no:cacheprovider")
    assert result.ret == 7  # deployment_plan.EXIT_DEPLOYMENT_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert output.count("deployment http://127.0.0.1:9 ($AFD_ASCEND_SERVER_URL=") == 1, output
    assert "ConnectionRefusedError" in output
    assert "skipped" not in output.splitlines()[-1]


# -- deploy through a command --------------------------------------------------------------------


def test_deploy_command_deploys_each_configuration_once_and_stops_it(pytester, tmp_path,
                                                                     no_deployment):
    """Cases ordered by configuration; each deployed once; all stopped by ``down``."""
    state = tmp_path / "state"
    no_deployment.setenv("AFD_ASCEND_DEPLOY_COMMAND", CPU_DEPLOY)
    no_deployment.setenv("AFD_CPU_DEPLOY_DIR", str(state))
    no_deployment.setenv("AFD_DEVICES_PER_NODE", "16")
    # The server's own batch window, not deploy-cpu's half second: each case here sends one
    # request, so the longer window only made every run wait it out.
    no_deployment.setenv(cpu_deploy.ENV_BATCH_WINDOW, str(DEFAULT_BATCH_WINDOW_S))
    pytester.makeconftest(DECLARING_CONFTEST)
    pytester.makepyfile(CASES + """
@pytest.mark.afd_deployments("none")
def test_a_none(afd_backend):
    run(afd_backend, "none")

@pytest.mark.afd_deployments("token_balanced")
def test_b_balanced(afd_backend):
    run(afd_backend, "token_balanced")

@pytest.mark.afd_deployments("none")
def test_c_none_again(afd_backend):
    run(afd_backend, "none")

@pytest.mark.afd_deployments("none")
def test_d_undeclared_run_fails(afd_backend):
    run(afd_backend, "request_boundary")
""")
    result = pytester.runpytest("--afd-backend", "vllm-ascend", "--npu-topology", TOPOLOGY,
                                "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=3, failed=1)
    # Same configuration together: a, c, d (none) before b (token_balanced).
    result.stdout.fnmatch_lines(["*test_a_none PASSED*", "*test_c_none_again PASSED*",
                                 "*test_d_undeclared_run_fails FAILED*", "*test_b_balanced PASSED*"])
    result.stdout.fnmatch_lines(["*ran server-side settings it does not declare*request_boundary*"])
    work = pytester.path / "afd-results" / "deployments" / f"{TOPOLOGY}-reduced"
    settings_files = sorted(work.glob("deployment-*-settings.json"))
    deployed = [json.loads(path.read_text())["split_policy"] for path in settings_files]
    # none, request_boundary (undeclared, on demand), token_balanced: each once.
    assert sorted(deployed) == ["none", "request_boundary", "token_balanced"], deployed
    plan = json.loads((work / "deployment-0-plan.json").read_text())
    assert plan["nodes"] == 2 and plan["afd_launch_plan"][:3] == ["afd-launch-plan", "--npu-topology",
                                                                   TOPOLOGY]
    assert not list(state.glob("*.json")), "every deployment was stopped with `down`"
    # Each deploy's seconds are recorded, and the next listing estimates with their median.
    times = json.loads((work / "deploy-times.json").read_text())
    assert sorted(json.loads(key)["split_policy"] for key in times) == sorted(deployed)
    assert all(len(seconds) == 1 and seconds[0] > 0 for seconds in times.values())
    listing = pytester.runpytest("--afd-backend", "vllm-ascend", "--npu-topology", TOPOLOGY,
                                 "-p", "no:cacheprovider", "--afd-list-deployments")
    assert listing.ret == 0
    estimate = json.loads((pytester.path / "afd-results" / "deployments.json").read_text())[
        "estimated_device_time"]
    assert "median of 3 deploy times recorded" in estimate["deploy_time_source"]
    assert estimate["deploys"] == 2  # none and token_balanced, as declared, each once
    listing.stderr.fnmatch_lines(["pytest-afd: estimated device time *2 deploys x *"])


def test_deploy_command_that_never_prints_a_url_stops_the_session(pytester, tmp_path, no_deployment):
    script = tmp_path / "deploy.sh"
    script.write_text("#!/bin/sh\necho 'quota exceeded' >&2\nexit 3\n")
    script.chmod(0o755)
    no_deployment.setenv("AFD_ASCEND_DEPLOY_COMMAND", str(script))
    no_deployment.setenv("AFD_DEVICES_PER_NODE", "16")
    pytester.makepyfile(CASES + """
def test_one(afd_backend):
    run(afd_backend, "none")

def test_two(afd_backend):
    run(afd_backend, "none")
""")
    result = pytester.runpytest("--afd-backend", "vllm-ascend", "-p", "no:cacheprovider")
    assert result.ret == 7
    output = result.stdout.str()
    assert output.count("exited 3 without printing a URL") == 1 and "quota exceeded" in output


@pytest.mark.parametrize("given", [("--afd-devices-per-node", "16"), ()])
def test_a_deploy_command_plans_with_the_users_devices_per_node_never_a_default(
        pytester, tmp_path, no_deployment, given):
    """The flag (no environment variable) sizes the plan: 2 nodes of 16; neither: one error."""
    script = tmp_path / "deploy.sh"
    script.write_text("#!/bin/sh\nexit 3\n")
    script.chmod(0o755)
    no_deployment.setenv("AFD_ASCEND_DEPLOY_COMMAND", str(script))
    pytester.makepyfile(CASES + """
def test_one(afd_backend):
    run(afd_backend, "none")

def test_two(afd_backend):
    run(afd_backend, "none")
""")
    result = pytester.runpytest("--afd-backend", "vllm-ascend", "--npu-topology", TOPOLOGY,
                                *given, "-p", "no:cacheprovider")
    assert result.ret == 7
    output = result.stdout.str()
    if not given:
        assert output.count("--afd-devices-per-node or $AFD_DEVICES_PER_NODE") == 1, output
        return
    work = pytester.path / "afd-results" / "deployments" / f"{TOPOLOGY}-reduced"
    plan = json.loads((work / "deployment-0-plan.json").read_text())
    assert (plan["devices_per_node"], plan["nodes"]) == (16, 2), plan
    assert output.count("exited 3 without printing a URL") == 1


# -- the listing ---------------------------------------------------------------------------------
def test_list_deployments_for_stage_a_runs_nothing(tmp_path, no_deployment, fork_server):
    # A fresh pytest process forked from the session's fork server (torch imported once).
    completed = fork_server.run_module(
        "pytest",
        ["-p", "no:cacheprovider", *UNRELATED_PLUGINS, "-m", "stage_a", "suites/stage_a",
         "--afd-backend", "vllm-ascend", "--npu-topology", TOPOLOGY, "--afd-devices-per-node", "16",
         "--afd-stage-scale", "1/64", "--afd-list-deployments", "--afd-results-dir", str(tmp_path)],
        cwd=REPO, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    document = json.loads((tmp_path / "deployments.json").read_text())
    reduced = [item for item in document["deployments"] if item["model"] == "reduced"]
    assert sorted(item["settings"]["split_policy"] for item in reduced) == [
        "none", "request_boundary", "token_balanced"]
    matrix = "suites/stage_a/test_stage_a_policies.py::test_stage_a_policy_matrix[smallest]"
    assert all(matrix in item["cases"] for item in reduced)
    assert all(item["nodes"] == 2 and "--devices-per-node" in item["afd_launch_plan"] for item in reduced)
    assert all(item["devices_per_node_given"] for item in reduced) and document["notes"] == []
    assert '"deployments"' in completed.stdout
    assert not (tmp_path / "summary.json").exists(), "nothing ran, nothing summarized"
    # The selection's device time: the smallest matrix declares 4 cases per policy.
    estimate = document["estimated_device_time"]
    assert estimate["deploy_time_source"].startswith("stated default")
    assert estimate["measured_cases"] >= 12 and estimate["deploys"] == len(document["deployments"])
    step = 140_000 / (6688 * 32)
    assert estimate["device_s"]["low"] == pytest.approx(
        estimate["deploys"] * 600 + estimate["measured_cases"] * (1 + 3) * step)
    assert "pytest-afd: estimated device time" in completed.stderr


# -- labels: emulated everywhere -----------------------------------------------------------------
def _manifest(emulated: bool, backend_name: str = "vllm-ascend") -> dict:
    from pytest_afd.results.manifest import collect_manifest
    from pytest_afd.topology.spec import parse_topology

    return collect_manifest(topology=parse_topology(TOPOLOGY), backend_name=backend_name,
                            backend_description={"devices_per_node": 16, "node_count": 2},
                            model_name="reduced", protocol={}, emulated=emulated)


def test_manifest_takes_nodes_and_devices_from_the_deployment_not_the_default():
    hardware = _manifest(False)["hardware"]
    assert (hardware["node_count"], hardware["devices_per_node"]) == (2, 16)
    assert hardware["devices_per_node_source"] == "deployment"


def test_a_stand_in_case_is_labelled_emulated_everywhere():
    from pytest_afd.run.result_writer import stand_in_labels

    fields = {"manifest": _manifest(False), "backend": "vllm-ascend", "labels": None,
              "evidence": {"gate": {"cpu_emulation": {"pcp_size": 8}}}}
    labelled = stand_in_labels(fields, "cpu")
    hardware = labelled["manifest"]["hardware"]
    assert hardware["emulated"] is True and hardware["device_type"].startswith("cpu")
    assert labelled["manifest"]["topology"]["cpu_emulation"]["pcp_size"] >= 1
    assert labelled["labels"]["comparability"] == "exploratory"
    assert "standing in" in labelled["labels"]["comparability_reason"]
    assert labelled["evidence"]["gate"]["cpu_emulation"] == {"pcp_size": 8}
    # On real devices the gate's CPU-emulation evidence is absent with the reason, never a claim.
    real = stand_in_labels(fields, None)
    assert real["evidence"]["gate"]["cpu_emulation"]["absent_reason"].startswith("runs on real")
    assert "labels" not in real or real["labels"] is None
