"""End to end: an instrumented ``pytest -m stage_a`` on the CPU rehearsal's deployments
(the deploy command, ``pytest-afd deploy-cpu``) fills every profile field from
traces, each case's overhead against its own measured runs, and the report shows them.

Slow (minutes on two cores): ``python3 -m pytest -m slow tests/profiling/test_profiled_rehearsal.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.inner_pytest import UNRELATED_PLUGINS

pytest.importorskip("msprof_analyze")

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = "dp3pcp8-ep8"
SCALE = "1/64"
WARMUPS, REPEATS = 1, 3  # the least the harness accepts
CLEARED = ("AFD_ASCEND_SERVER_URL", "AFD_ASCEND_SERVER_SETTINGS", "AFD_ASCEND_DEPLOYMENTS",
           "AFD_ASCEND_DEPLOY_COMMAND", "AFD_BACKEND", "AFD_REQUIRE_HARDWARE", "AFD_REFERENCE_PHASE",
           "AFD_EVIDENCE_DIR", "AFD_ALLOW_EMULATED", "AFD_STAGE_SCALE", "AFD_DEVICES_PER_NODE",
           "AFD_PROFILE", "AFD_PROFILE_KEEP_TRACES", "AFD_PROFILE_TRACE_DIRS")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@pytest.mark.slow
def test_instrumented_stage_a_on_cpu_deployments(tmp_path):
    traces, results = tmp_path / "traces", tmp_path / "results"
    env = {key: value for key, value in os.environ.items() if key not in CLEARED}
    env.update(PYTHONPATH=str(REPO), AFD_DEVICES_PER_NODE="16",
               AFD_ASCEND_DEPLOY_COMMAND=f"{sys.executable} -m pytest_afd.cli deploy-cpu",
               AFD_CPU_DEPLOY_DIR=str(tmp_path / "state"),
               AFD_EVIDENCE_DIR=str(tmp_path / "evidence"),
               AFD_PROFILE_KEEP_TRACES=str(traces), AFD_PROFILE_TRACE_DIRS=f"torch={traces}")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *UNRELATED_PLUGINS, "-rs", "-m",
         "stage_a and not slow", "suites", "--afd-backend", "vllm-ascend", "--npu-topology",
         TOPOLOGY, "--afd-stage-scale", SCALE, "--afd-results-dir", str(results),
         "--afd-require-hardware", "--afd-allow-emulated", "--afd-profile",
         "--afd-warmups", str(WARMUPS), "--afd-repeats", str(REPEATS)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=3000, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    docs = [json.loads(path.read_text()) for path in results.glob("*.json")]
    docs = [doc for doc in docs if doc.get("kind") == "afd-result"]
    assert docs and all(doc["case_kind"] == "stage_a" for doc in docs)
    for doc in docs:
        profile = doc["evidence"]["profile"]
        assert profile.get("source") == "torch_trace", (doc["case_id"], profile)
        roles = {row["role"] for row in profile["per_layer"] if row["layer"] >= 0}
        assert roles == {"attention", "ffn"}, doc["case_id"]
        assert profile["per_step"] and all(_number(step["overlap_fraction"])
                                           for step in profile["per_step"])
        assert profile["straggler"]["per_layer"] and profile["straggler"]["expert_load_per_rank"]
        assert {(c["role"], c["group"]) for c in profile["collectives"]} == {
            ("attention", "afd_connector"), ("ffn", "afd_connector")}
        assert all(c["volume_mb_per_step"] > 0 for c in profile["collectives"])
        assert all(0.0 <= profile["roles"][role]["busy_fraction"] <= 1.0
                   for role in ("attention", "ffn"))
        overhead = profile["profiler_overhead"]
        assert overhead["ratio"] > 0 and overhead["non_instrumented_runs"] == WARMUPS + REPEATS
    report = subprocess.run([sys.executable, "-m", "pytest_afd.cli", "report", str(results)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                            check=False)
    assert report.returncode == 0, report.stderr[-2000:]
    text = (results / "report" / "report.md").read_text()
    assert "Profile evidence of the instrumented runs" in text
    assert "afd_connector" in text and "profile_layers.png" in text
    assert "profile_overlap.png" in text
    assert not list((tmp_path / "state").glob("*.json")), "a deployment was left running"
