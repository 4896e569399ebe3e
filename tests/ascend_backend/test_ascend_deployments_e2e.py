"""End to end on CPU deployments: Stage A from the listing, the stages and the nightly rehearsal.

Slow (minutes on two cores): ``python3 -m pytest -m slow tests/ascend_backend/test_ascend_deployments_e2e.py``.
The fast checks of each mechanism are in ``test_ascend_deployments.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_afd.core.backend import RunSettings
from pytest_afd.serving.http_backend import cpu_server_spec
from pytest_afd.serving.lifecycle import ManagedServer
from tests.support.ascend_deployments import REHEARSAL, rehearsal_module
from tests.support.inner_pytest import UNRELATED_PLUGINS

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = "dp3pcp8-ep8"
SCALE = "1/64"
CLEARED = ("AFD_ASCEND_SERVER_URL", "AFD_ASCEND_SERVER_SETTINGS", "AFD_ASCEND_DEPLOYMENTS",
           "AFD_ASCEND_DEPLOY_COMMAND", "AFD_BACKEND", "AFD_REQUIRE_HARDWARE", "AFD_REFERENCE_PHASE",
           "AFD_EVIDENCE_DIR", "AFD_ALLOW_EMULATED", "AFD_STAGE_SCALE", "AFD_DEVICES_PER_NODE")


def clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in CLEARED}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def pytest_run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           *UNRELATED_PLUGINS, "-rs", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=3000,
                          check=False)


def results(results_dir: Path) -> list[dict]:
    docs = (json.loads(path.read_text()) for path in results_dir.rglob("*.json"))
    return [doc for doc in docs if isinstance(doc, dict) and doc.get("kind") == "afd-result"]


def test_rehearsal_runs_the_nightly_workflows_own_pytest_commands():
    """Fast: the steps come from nightly-ascend.yml itself (gates twice, then the stage)."""
    module = rehearsal_module()
    import yaml

    job_env, steps = module.rehearsed_steps(yaml.safe_load(module.WORKFLOW.read_text()))
    runs = [step["run"] for step in steps]
    assert len(runs) == 3
    assert "--afd-reference-phase record" in runs[0] and "--afd-reference-phase check" in runs[1]
    assert '-m "$STAGE"' in runs[2] and all("--afd-require-hardware" in run for run in runs)
    assert module.resolve(job_env["STAGE"], Path("/w")) == "stage_a"
    assert module.resolve(job_env["AFD_EVIDENCE_DIR"], Path("/w")) == "/w/afd-results/evidence"


@pytest.mark.slow
def test_stage_a_on_one_cpu_server_per_listed_deployment(tmp_path, monkeypatch):
    """The issue's first "done when": list, start one server per entry, attach, 0 failed/skipped."""
    listed = pytest_run(["-m", "stage_a and not slow", "suites/stage_a", "--afd-backend", "vllm-ascend",
                         "--npu-topology", TOPOLOGY, "--afd-stage-scale", SCALE,
                         "--afd-list-deployments", "--afd-results-dir", str(tmp_path / "listing")],
                        clean_env())
    assert listed.returncode == 0, listed.stdout[-3000:]
    entries = json.loads((tmp_path / "listing" / "deployments.json").read_text())["deployments"]
    servers, deployments = [], []
    evidence = tmp_path / "evidence"  # the servers inherit it and write their step lines there
    monkeypatch.setenv("AFD_EVIDENCE_DIR", str(evidence))
    try:
        for index, entry in enumerate(entries):
            spec = cpu_server_spec(RunSettings(**entry["settings"]), name=f"d{index}",
                                   log_dir=tmp_path, topology=entry["npu_topology"],
                                   model_name=entry["model"], seed=0)
            servers.append(ManagedServer(spec, tmp_path).start())
            deployments.append({"url": servers[-1].base_url, "settings": entry["settings"]})
        (tmp_path / "deployments.json").write_text(json.dumps(deployments))
        env = clean_env(AFD_ASCEND_DEPLOYMENTS=str(tmp_path / "deployments.json"),
                        AFD_EVIDENCE_DIR=str(evidence))
        run = pytest_run(["-m", "stage_a and not slow", "suites/stage_a", "--afd-backend",
                          "vllm-ascend", "--npu-topology", TOPOLOGY, "--afd-stage-scale", SCALE,
                          "--afd-results-dir", str(tmp_path / "results"), "--afd-require-hardware",
                          "--afd-allow-emulated"], env)
    finally:
        for server in servers:
            server.stop()
    assert run.returncode == 0, run.stdout[-4000:]
    assert " failed" not in run.stdout and " skipped" not in run.stdout.splitlines()[-1]
    docs = [doc for doc in results(tmp_path / "results") if doc["case_kind"] == "stage_a"]
    policies = {doc["settings"]["async_moe"]["split_policy"] for doc in docs}
    assert policies == {"none", "request_boundary", "token_balanced"}, policies
    for doc in docs:  # step evidence for every policy, and labelled emulated
        assert isinstance(doc["evidence"]["steps"], list) and doc["evidence"]["steps"], doc["case_id"]
        assert doc["manifest"]["hardware"]["emulated"] is True
        assert doc["labels"]["comparability"] == "exploratory"


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["stage_a", "stage_b", "stage_c", "stage_d", "stage_e", "stage_f"])
def test_stage_through_the_deploy_command(tmp_path, stage):
    """Each stage at 1/64 through AFD_ASCEND_DEPLOY_COMMAND: passes, nothing missing, all stopped."""
    state = tmp_path / "state"
    env = clean_env(AFD_ASCEND_DEPLOY_COMMAND=f"{sys.executable} -m pytest_afd.cli deploy-cpu",
                    AFD_CPU_DEPLOY_DIR=str(state), AFD_DEVICES_PER_NODE="16",
                    AFD_EVIDENCE_DIR=str(tmp_path / "evidence"))
    run = pytest_run(["-m", stage, "suites", "--afd-backend", "vllm-ascend", "--npu-topology",
                      TOPOLOGY, "--afd-stage-scale", SCALE, "--afd-results-dir",
                      str(tmp_path / "results"), "--afd-require-hardware", "--afd-allow-emulated"],
                     env)
    assert run.returncode == 0, run.stdout[-4000:]
    assert "no deployment in " not in run.stdout
    assert " skipped" not in run.stdout.splitlines()[-1], run.stdout[-4000:]  # every case ran
    assert not list(state.glob("*.json")), "a deployment was left running"


@pytest.mark.slow
def test_the_nightly_rehearsal_passes(tmp_path):
    completed = subprocess.run([sys.executable, str(REHEARSAL), "--workspace", str(tmp_path)],
                               cwd=REPO, env=clean_env(), capture_output=True, text=True,
                               timeout=3000, check=False)
    assert completed.returncode == 0, completed.stdout[-4000:]
