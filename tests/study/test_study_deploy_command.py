"""The whole study through the CPU deploy command, end to end (slow; nightly rehearsal too).

The sequence of study_sequence.py with ``--afd-backend vllm-ascend`` and
``AFD_ASCEND_DEPLOY_COMMAND="python -m pytest_afd.cli deploy-cpu"``: every configuration a
case needs is deployed through the deploy-command protocol (docs/ascend.md), by the
harness's CPU server standing in for the cluster, and the gates run in their two phases
(record the references, then check the candidates) as on a deployment. Checked: every
case's manifest carries the study digest and says it was served by a deployment that
command started (its mode, its command line, the stand-in device); the bundle validates
and agrees with its own tables; its limitations, derived from the evidence, name the CPU
stand-in, the reduced layers and the forced routing; its first line refuses a production
recommendation. docs/study.md, "The study through a deploy command".
"""

from __future__ import annotations

import sys

import pytest

from pytest_afd.study import limitations
from tests.study.study_sequence import (
    StudyRun,
    base_env,
    check_bundle,
    check_stage_d_sizes,
    check_stages_b_e,
    results,
)

pytestmark = pytest.mark.slow

DEPLOY_COMMAND = f"{sys.executable} -m pytest_afd.cli deploy-cpu"
GATE_PHASES = (("gates-reference", ("--afd-reference-phase", "record")),
               ("gates", ("--afd-reference-phase", "check")))
DEPLOYED = "deploy"  # manifest.backend.description.mode of a deploy-command session
REFUSAL = "This bundle makes no production recommendation"


def deploy_env(tmp_path) -> dict[str, str]:
    (tmp_path / "evidence").mkdir()
    return base_env(tmp_path, AFD_BACKEND="vllm-ascend", AFD_NPU_TOPOLOGY="dp3pcp8-ep8",
                    AFD_MODEL="reduced", AFD_ASCEND_DEPLOY_COMMAND=DEPLOY_COMMAND,
                    AFD_CPU_DEPLOY_DIR=str(tmp_path / "deployments"), AFD_ALLOW_EMULATED="1",
                    AFD_EVIDENCE_DIR=str(tmp_path / "evidence"))


def check_deployed(doc: dict, lineage: set[str]) -> None:
    """One case: under one of the study's versions, served by a deployment the command started."""
    manifest = doc["manifest"]
    assert manifest["study"]["digest"] in lineage, doc["case_id"]
    described = manifest["backend"]["description"]
    assert described["mode"] == DEPLOYED and described["deploy_command"] == DEPLOY_COMMAND, (
        doc["case_id"], described)
    assert doc["backend"] == "vllm-ascend" and manifest["run"]["backend_mode"] == "http_deploy"
    assert manifest["hardware"]["emulated"] is True, doc["case_id"]
    assert "standing in" in manifest["hardware"]["device_type"], doc["case_id"]


def test_study_through_the_cpu_deploy_command(tmp_path):
    sequence = StudyRun(tmp_path, deploy_env(tmp_path), gate_steps=GATE_PHASES)
    run = sequence.whole("cpu-deploy-rehearsal")
    lineage = {run["frozen"]["digest"], run["referenced"]["digest"], run["chunked"]["digest"]}
    for directory in run["every"]:
        for doc in results(directory):
            check_deployed(doc, lineage)
    check_stages_b_e(run)
    check_stage_d_sizes(run)
    regions = check_bundle(run)
    assert regions["headline"].startswith(REFUSAL)
    assert (run["bundle"] / "study.md").read_text().splitlines()[0].lstrip("# ").startswith(REFUSAL)
    kinds = {item["kind"]: item["text"] for item in regions["limitations"]}
    assert {limitations.EMULATED, limitations.REDUCED_LAYERS, limitations.FORCED} <= set(kinds)
    assert "CPU stand-in" in kinds[limitations.EMULATED]
    assert not regions["excluded"], regions["excluded"]
    assert not list((tmp_path / "deployments").glob("*.json")), "a deployment was left running"
