"""Gates 1-3 on ``--afd-backend vllm-ascend`` in attach mode, across deployments, over HTTP.

The CPU HTTP server stands in for the cluster deployment (real processes on
loopback): a reference deployment (unsplit, uncached, unchunked) for the
reference phase, then candidate deployments (token-balanced split; prefix
caching; chunked prefill) for the candidate phase, each attached the way a
cluster job attaches the harness (``AFD_ASCEND_SERVER_URL`` + declared
settings). The gates compare top-k logprobs: no logits cross the API. A
candidate served with a seeded split fault must be rejected, naming the
difference. Cases a deployment cannot run are skips naming the mismatch, and
the session says that nothing was measured on hardware.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from pytest_afd.backends.vllm_ascend.backend import (
    ENV_SERVED_MODEL_NAME,
    ENV_SERVER_SETTINGS,
    ENV_SERVER_URL,
    LAUNCH_FIELDS,
)
from pytest_afd.core.backend import RunSettings
from pytest_afd.serving.http_backend import cpu_server_spec
from pytest_afd.serving.lifecycle import ManagedServer
from pytest_afd.topology.spec import parse_topology
from tests.support.inner_pytest import UNRELATED_PLUGINS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = "dp3pcp8-ep8"
MODEL = "reduced"
# The gates scale their 16-token page counts to the deployment's 128-token page.
PAGE = 128
GATES = (
    "suites/gates/test_gate_1_token_split.py::test_gate_1_token_balanced_matches_unsplit",
    "suites/gates/test_gate_2_prefix_hit.py",
    "suites/gates/test_gate_3_chunked.py",
)
# The fault the broken candidate is served with (pytest_afd.faults.registry, by name).
FAULT_ENV = "PYTEST_AFD_FAULT"
SEEDED_FAULT = "positions_not_sliced"


def deployment_settings(**fields) -> RunSettings:
    emulation = parse_topology(TOPOLOGY).cpu_emulation()
    return RunSettings(block_size=PAGE, split_align=emulation.split_align,
                       pcp_size=emulation.pcp_size, return_logits=False, **fields)


REFERENCE = deployment_settings(split_policy="none")
CACHED = deployment_settings(split_policy="token_balanced", prefix_caching=True)
CHUNKED = deployment_settings(split_policy="token_balanced", chunk_size=32 * PAGE // 16)


def declared(settings: RunSettings) -> str:
    """What the cluster job declares in AFD_ASCEND_SERVER_SETTINGS (the launch fields)."""
    values = dataclasses.asdict(settings)
    return json.dumps({name: values[name] for name in LAUNCH_FIELDS})


def serve(settings: RunSettings, log_dir: Path, fault: str | None = None) -> ManagedServer:
    spec = cpu_server_spec(settings, name="deployment", log_dir=log_dir, topology=TOPOLOGY,
                           model_name=MODEL, seed=0, startup_timeout_s=300)
    if fault is not None:
        spec = dataclasses.replace(spec, env={**spec.env, FAULT_ENV: fault})
    return ManagedServer(spec, log_dir).start()


def run_gates(tmp_path: Path, name: str, phase: str, server: ManagedServer,
              settings: RunSettings, *extra: str) -> tuple[int, dict[str, str], str, dict]:
    """One pytest session attached to ``server``: (exit code, outcome per test, output, summary)."""
    results, junit = tmp_path / f"results-{name}", tmp_path / f"{name}.xml"
    env = {**os.environ, "PYTHONPATH": str(REPO), ENV_SERVER_URL: server.base_url,
           ENV_SERVER_SETTINGS: declared(settings)}
    env.pop(FAULT_ENV, None)
    # As documented: the served model name ("reduced") is read from the deployment's /v1/models.
    env.pop(ENV_SERVED_MODEL_NAME, None)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *UNRELATED_PLUGINS,
               "-m", "gate", "-k",
               "not w8a8", "-rs", *GATES, "--afd-backend", "vllm-ascend", "--npu-topology",
               TOPOLOGY, "--afd-reference-phase", phase, "--afd-golden-dir",
               str(tmp_path / "golden"), "--afd-results-dir", str(results),
               f"--junitxml={junit}", *extra]
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                               timeout=1800, check=False)
    outcomes = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name")] = kinds[0] if kinds else "passed"
    summary = json.loads((results / "summary.json").read_text())
    return completed.returncode, outcomes, completed.stdout + completed.stderr, summary


def passed(outcomes: dict[str, str]) -> set[str]:
    return {name for name, outcome in outcomes.items() if outcome == "passed"}


def test_reference_then_candidate_phases_pass_and_a_broken_split_is_rejected(tmp_path):
    with serve(REFERENCE, tmp_path / "reference") as server:
        code, outcomes, output, summary = run_gates(tmp_path, "record", "record", server, REFERENCE)
    assert code == 0, output
    # Every unquantized gate 1-3 case recorded its reference from this one deployment, but
    # the 41-request case, which needs a deployment of max_num_seqs 41: a skip naming it.
    skipped = {name for name, outcome in outcomes.items() if outcome == "skipped"}
    assert skipped == {f"test_gate_1_token_balanced_matches_unsplit[{TOPOLOGY}-none-"
                       "many_small_requests]"}, outcomes
    assert "{'max_num_seqs': (8, 41)}" in output
    assert len(passed(outcomes)) == 12 and set(outcomes.values()) == {"passed", "skipped"}
    assert "0 cases measured on hardware" in output
    assert summary["hardware"]["cases_measured_on_hardware"] == 0
    assert summary["hardware"]["cases_on_stand_in"] == 12
    stored = sorted(p.relative_to(tmp_path / "golden").as_posix()
                    for p in (tmp_path / "golden").rglob("*.json"))
    assert len(stored) == 12 and all(p.startswith("reference/gate") for p in stored), stored

    with serve(CACHED, tmp_path / "cached") as server:
        code, outcomes, output, summary = run_gates(tmp_path, "cached", "check", server, CACHED)
    assert code == 0, output
    passed_with_cache = passed(outcomes)
    assert passed_with_cache == {
        f"test_gate_1_token_balanced_matches_unsplit[{TOPOLOGY}-none-prefix_hit_nonzero_computed]",
        *(f"test_gate_2_prefix_hit_matches_uncached[{TOPOLOGY}-none-{case}]"
          for case in ("shared_prefix", "partial_page_prefix", "repeated_prompts")),
    }, outcomes
    # The cases this deployment cannot serve say which launch settings differ.
    assert "was started with other settings" in output and "'chunk_size'" in output
    verdicts = [json.loads(Path(entry["path"]).read_text())["evidence"]["gate"]
                for entry in summary["results"]]
    assert {v["verdict"]["tolerance_profile"] for v in verdicts} == {"topk_logprob (k=5)"}
    assert all(v["reference"]["phase"] == "check" for v in verdicts)

    with serve(CHUNKED, tmp_path / "chunked") as server:
        code, outcomes, output, _ = run_gates(tmp_path, "chunked", "check", server, CHUNKED)
    assert code == 0, output
    assert f"test_gate_3_chunked_matches_unchunked[{TOPOLOGY}-none-32]" in passed(outcomes)
    assert "--afd-require-hardware" not in output

    with serve(CACHED, tmp_path / "broken", fault=SEEDED_FAULT) as server:
        code, outcomes, output, _ = run_gates(tmp_path, "broken", "check", server, CACHED)
    assert code == pytest.ExitCode.TESTS_FAILED, output[-3000:]
    failed = {name for name, outcome in outcomes.items() if outcome == "failure"}
    assert failed and failed <= passed_with_cache, outcomes
    # The rejection names the profile and the rows whose tokens left each other's top-k.
    assert "outputs differ beyond topk_logprob" in output, output[-3000:]
    assert re.search(r"row \d+: token \d+ vs golden \d+", output), output[-3000:]
