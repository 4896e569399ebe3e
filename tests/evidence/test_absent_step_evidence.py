"""Absent step evidence is an absent record with its reason, never ``[]`` and zero tokens.

A run whose backend reports no steps (a deployment behind HTTP without
``AFD_EVIDENCE_DIR``, a case whose worker lines are unusable or missing) must not
read as "0 tokens scheduled in 0 ubatches": ``evidence.steps`` and
``evidence.tokens`` are ``{"value": null, "absent_reason": ...}`` naming why, the
result is schema-valid, and the report renders it.
"""

from __future__ import annotations

import pytest

from pytest_afd.backends.vllm_ascend.worker_evidence import (
    NO_STEP_LINES,
    WorkerEvidence,
    with_worker_evidence,
)
from pytest_afd.core.backend import RequestOutput, RunOutputs, RunSettings
from pytest_afd.report.tables import _tokens_text
from pytest_afd.report.values import mean_imbalance, step_time_s
from pytest_afd.results import documents as results
from pytest_afd.results.manifest import collect_manifest
from pytest_afd.results.parts import NO_STEPS_REPORTED
from pytest_afd.serving.http_backend import STEPS_NOT_OVER_HTTP
from pytest_afd.topology.spec import parse_topology

PROTOCOL = {"seed": 0, "warmups": 0, "repetitions": 1, "run_order": "interleaved",
            "instrumented": False, "routing": "natural"}
TOPOLOGY = parse_topology("dp3pcp8-ep8")


def _result(outputs: RunOutputs) -> dict:
    doc = results.build_result(
        case_id="evidence::absent_steps", case_kind="stage_a", backend="vllm-ascend",
        settings=RunSettings(split_policy="request_boundary"),
        manifest=collect_manifest(topology=TOPOLOGY, backend_name="vllm-ascend",
                                  backend_description={"model": {"num_layers": 61}},
                                  model_name="deepseek-v3.2", protocol=PROTOCOL, emulated=False),
        workload=results.workload_json(dataset_name="synthetic", prompt_lengths=[64], seed=0),
        protocol=PROTOCOL, metrics=results.metrics_from_runs([outputs]),
        evidence=results.evidence_from_outputs(outputs, routing="natural",
                                               num_ep_ranks=TOPOLOGY.num_ep_ranks))
    results.validate_result(doc)
    return doc


def _over_http(**changes) -> RunOutputs:
    return RunOutputs(requests=[RequestOutput("r0", 64, 0, 1, ttft_s=0.1)], wall_time_s=0.2,
                      **changes)


@pytest.mark.parametrize(("outputs", "reason"), [
    (_over_http(steps_absent_reason=STEPS_NOT_OVER_HTTP), STEPS_NOT_OVER_HTTP),
    (_over_http(), NO_STEPS_REPORTED),
    (with_worker_evidence(_over_http(), WorkerEvidence()), NO_STEP_LINES),
    (with_worker_evidence(_over_http(), WorkerEvidence(problems=["rank0.jsonl: cap"])),
     "rank0.jsonl: cap"),
])
def test_no_steps_is_an_absent_record_with_its_reason(outputs, reason):
    doc = _result(outputs)
    steps, tokens = doc["evidence"]["steps"], doc["evidence"]["tokens"]
    assert results.is_absent(steps) and results.is_absent(tokens)  # not [] and 0 tokens
    assert reason in steps["absent_reason"] and tokens == steps
    assert mean_imbalance(doc) is None and step_time_s(doc) is None
    assert _tokens_text(doc) != "64 / 0 / 0"


def test_recorded_steps_are_still_counted():
    step = {"policy": "none", "split_token": None, "imbalance": None,
            "ubatches": [{"num_real_tokens": 64, "num_padded_tokens": 0}]}
    doc = _result(_over_http(steps=[step], steps_absent_reason=STEPS_NOT_OVER_HTTP))
    assert doc["evidence"]["steps"] == [step]
    assert doc["evidence"]["tokens"]["per_ubatch_real_tokens"] == [64]


def test_gate_counts_read_from_steps_are_absent_without_steps(monkeypatch):
    """Gates 1 and 3 record split forwards and final pieces from the run's steps: without
    steps they are absent with the reason, not 0 forwards and no pieces."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "suites" / "gates"))
    from gate_evidence import NO_STEP_EVIDENCE, shape_unverified, step_derived

    bare = _over_http(steps_absent_reason=STEPS_NOT_OVER_HTTP)
    for value in (0, [], {}):
        recorded = step_derived(bare, value)
        assert results.is_absent(recorded)
        assert NO_STEP_EVIDENCE in recorded["absent_reason"]
        assert STEPS_NOT_OVER_HTTP in recorded["absent_reason"]
    stepped = _over_http(steps=[{"policy": "none"}])
    assert step_derived(stepped, 0) == 0 and shape_unverified(stepped) is None


def test_the_report_renders_a_case_with_absent_step_evidence(tmp_path):
    from pytest_afd import report

    step = {"policy": "token_balanced", "split_token": 32, "imbalance": 0.0,
            "ubatches": [{"num_real_tokens": 32, "num_padded_tokens": 0}] * 2}
    for case, outputs in (("absent", _over_http(steps_absent_reason=STEPS_NOT_OVER_HTTP)),
                          ("recorded", _over_http(steps=[step]))):
        doc = {**_result(outputs), "case_id": f"evidence::{case}"}
        results.write_result(results.result_path(tmp_path, doc["case_id"]), doc)
    text = report.render(tmp_path).read_text()
    assert "64 / 64 / 0" in text  # the recorded case's tokens
    assert "64 / 0 / 0" not in text  # the absent one is never shown as zero scheduled
