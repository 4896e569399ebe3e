"""Worker evidence lines: written whole and bounded, collected per case into schema-valid results."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from afd_split import SplitConstraints
from afd_split.hook.planning.engine_step import StepRanks, plan_engine_step, step_record
from afd_split.hook.planning.worker_evidence import (
    CAP_MARKER_KIND,
    EVIDENCE_DIR_ENV,
    MARKER_RESERVE_BYTES,
    MAX_BYTES_ENV,
    EvidenceWriter,
    encode_line,
    max_bytes_from_env,
)
from pytest_afd.backends import create_backend
from pytest_afd.backends.vllm_ascend.worker_evidence import (
    WorkerEvidenceBackend,
    read_new_records,
    snapshot_offsets,
    summed_expert_load,
    with_worker_evidence,
)
from pytest_afd.core.backend import PromptRequest, RunOutputs, RunSettings
from pytest_afd.results import documents as results
from pytest_afd.results.manifest import collect_manifest
from pytest_afd.topology.spec import parse_topology

READ_LIMIT = 1 << 20
PROTOCOL = {"seed": 0, "warmups": 0, "repetitions": 1, "run_order": "interleaved",
            "instrumented": False, "routing": "natural"}


class RequestsOnly:
    """What crosses the HTTP API: the inner backend's requests and wall time, no steps or load."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.full: RunOutputs | None = None

    def run(self, prompts, settings):
        self.full = self.inner.run(prompts, settings)
        return RunOutputs(requests=self.full.requests, wall_time_s=self.full.wall_time_s)

    def describe(self):
        return self.inner.describe()


def _record(step, *, dp=0, tp=0, pcp=0, load=((1, 2), (3, 4))):
    plan = plan_engine_step([30, 10], policy="token_balanced", constraints=SplitConstraints(),
                            num_computed_tokens=[0, 4])
    return step_record(plan, step=step, ranks=StepRanks(global_rank=dp * 2 + tp, dp_rank=dp,
                                                         tp_rank=tp, pcp_rank=pcp),
                       expert_load=None if load is None else np.asarray(load))


def test_cpu_backend_lines_round_trip_into_a_schema_valid_result(tmp_path, monkeypatch):
    evidence_dir = tmp_path / "evidence"
    monkeypatch.setenv(EVIDENCE_DIR_ENV, str(evidence_dir))
    inner = create_backend("cpu", topology=None, model_name="reduced", seed=0,
                           results_dir=str(tmp_path))
    try:
        over_http = RequestsOnly(inner)
        backend = WorkerEvidenceBackend.wrap_from_env(over_http, os.environ)
        rng = np.random.default_rng(0)
        prompts = [PromptRequest(f"r{i}", tuple(rng.integers(0, 2048, n).tolist()))
                   for i, n in enumerate((180, 24, 40))]
        settings = RunSettings(split_policy="token_balanced", block_size=32,
                               chunk_size=64, max_num_batched_tokens=128)
        backend.run(prompts, settings)  # an earlier case: its lines must not leak into the next
        outputs = backend.run(prompts, settings)
    finally:
        inner.close()
    assert backend.last_problems == []
    expected = json.loads(json.dumps(over_http.full.steps))
    for step in expected:  # joined by request id; the server's numbering kept beside it
        step["schedule"]["server_requests"] = step["schedule"]["requests"]
    assert len(expected) > 1 and outputs.steps == expected
    assert outputs.expert_load == over_http.full.expert_load
    topology = parse_topology("dp3pcp8-ep8")
    manifest = collect_manifest(topology=topology, backend_name="vllm-ascend",
                                backend_description={"model": {"num_layers": 10}},
                                model_name="reduced", protocol=PROTOCOL, emulated=True)
    doc = results.build_result(
        case_id="integrations::worker_evidence", case_kind="stage_a", backend="vllm-ascend",
        settings=settings, manifest=manifest,
        workload=results.workload_json(dataset_name="synthetic", prompt_lengths=[180, 24, 40],
                                       seed=0),
        protocol=PROTOCOL, metrics=results.metrics_from_runs([outputs]),
        evidence=results.evidence_from_outputs(outputs, routing="natural",
                                               num_ep_ranks=topology.num_ep_ranks))
    results.validate_result(doc)
    assert doc["evidence"]["tokens"]["scheduled_real_tokens"] == sum((180, 24, 40))
    assert not results.is_absent(doc["evidence"]["expert_load"])


def test_leaders_per_dp_replica_and_their_expert_load(tmp_path):
    for dp in (1, 0):
        for tp in (0, 1):
            with EvidenceWriter(tmp_path, f"attention-rank{dp * 2 + tp}") as writer:
                for step in range(2):
                    writer.append(_record(step, dp=dp, tp=tp))
    evidence = read_new_records(tmp_path, {}, max_read_bytes=READ_LIMIT)
    assert evidence.problems == [] and len(evidence.records) == 8
    leaders = evidence.leader_records
    assert [(r["ranks"]["dp_rank"], r["step"]) for r in leaders] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert summed_expert_load(leaders) == [[4, 8], [12, 16]]
    assert summed_expert_load([_record(0), _record(1, load=None)]) is None


def test_expert_load_adds_every_pcp_rank_once_per_tp_group(tmp_path):
    """Under PCP each rank routes its own rows of a stage; TP ranks route the same ones."""
    loads = {0: ((1, 2), (3, 4)), 1: ((10, 20), (30, 40))}
    for pcp, load in loads.items():
        for tp in (0, 1):
            with EvidenceWriter(tmp_path, f"attention-rank{pcp * 2 + tp}") as writer:
                writer.append(_record(0, tp=tp, pcp=pcp, load=load))
    evidence = read_new_records(tmp_path, {}, max_read_bytes=READ_LIMIT)
    assert evidence.problems == [] and len(evidence.records) == 4
    assert [r["ranks"]["pcp_rank"] for r in evidence.leader_records] == [0]  # one step line
    outputs = with_worker_evidence(RunOutputs(requests=[]), evidence)
    assert outputs.expert_load == [[11, 22], [33, 44]]
    assert outputs.steps[0]["expert_load"] == [[11, 22], [33, 44]]  # the step's: both PCP ranks'
    assert outputs.steps[0]["expert_load_pcp_ranks"] == [0, 1]


def test_an_incomplete_last_line_is_reported_and_no_partial_steps_are_used(tmp_path):
    with EvidenceWriter(tmp_path, "attention-rank0") as writer:
        writer.append(_record(0))
        writer.append(_record(1))
    line = json.dumps(_record(2)).encode()
    with open(tmp_path / "attention-rank0.jsonl", "ab") as handle:
        handle.write(line[: len(line) // 2])  # a writer killed mid-line
    evidence = read_new_records(tmp_path, {}, max_read_bytes=READ_LIMIT)
    assert [r["step"] for r in evidence.records] == [0, 1]
    assert len(evidence.problems) == 1 and "incomplete last line" in evidence.problems[0]
    outputs = with_worker_evidence(RunOutputs(requests=[]), evidence)
    assert outputs.steps == [] and "incomplete last line" in outputs.steps_absent_reason


def test_the_cap_stops_the_writer_with_a_marker_and_the_file_stays_bounded(tmp_path):
    cap = MARKER_RESERVE_BYTES + 3 * len(encode_line(_record(10))) + 1
    writer = EvidenceWriter(tmp_path, "attention-rank0", max_bytes=cap)
    accepted = [writer.append(_record(step)) for step in range(20)]
    writer.close()
    path = tmp_path / "attention-rank0.jsonl"
    assert path.stat().st_size <= cap
    assert accepted.index(False) == 3 and not any(accepted[3:])
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and json.loads(lines[-2])["kind"] == CAP_MARKER_KIND
    evidence = read_new_records(tmp_path, {}, max_read_bytes=READ_LIMIT)
    assert any(f"steps from {accepted.index(False)} on are missing" in p for p in evidence.problems)
    reopened = EvidenceWriter(tmp_path, "attention-rank0", max_bytes=cap)
    assert reopened.capped and reopened.append(_record(99)) is False
    reopened.close()


def test_a_case_over_the_read_limit_or_with_foreign_lines_is_refused_by_name(tmp_path):
    with EvidenceWriter(tmp_path, "attention-rank0") as writer:
        offsets = snapshot_offsets(tmp_path)
        for step in range(5):
            writer.append(_record(step))
    too_big = read_new_records(tmp_path, offsets, max_read_bytes=100)
    assert too_big.records == [] and "exceed the 100-byte read limit" in too_big.problems[0]
    with open(tmp_path / "attention-rank0.jsonl", "ab") as handle:
        handle.write(b'{"kind": "afd_step", "format": 99}\nnot json\n')
    evidence = read_new_records(tmp_path, snapshot_offsets(tmp_path) | {"attention-rank0.jsonl": 0},
                                max_read_bytes=READ_LIMIT)
    assert len(evidence.records) == 5
    assert any("format 99, expected 1" in p for p in evidence.problems)
    assert any("not JSON" in p for p in evidence.problems)


@pytest.mark.parametrize(("raw", "message"), [("lots", "is not an integer"),
                                              ("10", "is below the minimum")])
def test_a_bad_cap_names_the_environment_variable(raw, message):
    with pytest.raises(ValueError, match=f"{MAX_BYTES_ENV}='{raw}' {message}"):
        max_bytes_from_env({MAX_BYTES_ENV: raw})


def test_without_the_directory_nothing_is_written_or_wrapped(tmp_path):
    assert EvidenceWriter.from_env({}, "attention-rank0") is None
    inner = object()
    assert WorkerEvidenceBackend.wrap_from_env(inner, {}) is inner
