"""Expert load end to end on the stand-ins: planned steps, per-stage dispatches through the
patched connector seam, evidence lines, the vllm-ascend backend's reader, a schema-valid
result. The expected counts are an independent numpy bincount of the dispatched ids."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from afd_split.engine.ascend import ASCEND_LAYOUTS
from afd_split.hook.facts.drift_guard import TOKEN_BALANCED_SPLIT
from afd_split.hook.install import install_deferred
from afd_split.hook.patches.dispatch import install_dispatch
from afd_split.hook.planning.engine_step import StepRanks
from afd_split.hook.planning.stages import HookSession, ascend_splitter
from afd_split.hook.planning.worker_evidence import EVIDENCE_DIR_ENV
from pytest_afd.backends.vllm_ascend.worker_evidence import read_new_records, with_worker_evidence
from pytest_afd.core.backend import RequestOutput, RunOutputs, RunSettings
from pytest_afd.results import documents as results
from pytest_afd.results.manifest import collect_manifest
from pytest_afd.topology.spec import parse_topology
from tests.support.hook_standins import (
    BLOCK_SIZE,
    _load,
    ascend_common,
    call_planner,
    standin_connector_source,
)
from tests.support.split_threshold import SPLIT_EVERY_STEP

SCHEDULED = [40, 7, 9]
COMPUTED = [24, 0, 5]
NUM_LAYERS, NUM_EXPERTS, TOP_K = 3, 16, 2
TOPOLOGY = parse_topology("dp3pcp8-ep8")
EXPERT_PER_RANK = NUM_EXPERTS // TOPOLOGY.num_ep_ranks
PROTOCOL = {"seed": 0, "warmups": 0, "repetitions": 1, "run_order": "interleaved",
            "instrumented": False, "routing": "natural"}


@pytest.fixture
def connector_class(tmp_path):
    module = _load(tmp_path / "async_cam.py", standin_connector_source("main"))
    install_dispatch(module)
    yield module.CAMAsyncAFDConnector
    sys.modules.pop(module.__name__, None)


def new_session_factory(evidence_dir, routing="natural"):
    def new_session(runner) -> HookSession:
        return HookSession.from_environment(
            {EVIDENCE_DIR_ENV: str(evidence_dir), **SPLIT_EVERY_STEP}, ranks=StepRanks(global_rank=0),
            groups=[], splitter=ascend_splitter(chunked_prefill=False), num_layers=NUM_LAYERS,
            routing=routing)

    return new_session


def make_runner(seams, connector_class):
    runner = seams.runner_class()
    common, meta = ascend_common(ASCEND_LAYOUTS[0], SCHEDULED, COMPUTED)
    runner.afd_async_extra_info = SimpleNamespace(async_moe_split=TOKEN_BALANCED_SPLIT)
    runner.input_batch = SimpleNamespace(
        num_computed_tokens_cpu_tensor=common.num_computed_tokens_cpu.clone())
    runner.cache_config = SimpleNamespace(block_size=BLOCK_SIZE)
    runner.connector = connector_class(topk=TOP_K, num_routed_experts=NUM_EXPERTS,
                                       expert_per_rank=EXPERT_PER_RANK)
    runner.common, runner.real_batch, runner.long_seq_metadata = common, meta, "full-batch"
    return runner


class Context:
    def __init__(self, layer_idx, stage_idx, total_tokens):
        self.metadata = SimpleNamespace(layer_idx=layer_idx, stage_idx=stage_idx,
                                        total_tokens=total_tokens)


def run_step(runner, seed):
    """Plan one step, then dispatch every layer of every stage as the plugin's forward does;
    the expected per-layer per-expert counts of the step."""
    call_planner(runner, "main", SCHEDULED)
    stages = runner._afd_async_moe_ubatch_metadata["ubatch_slices"]
    generator = torch.Generator().manual_seed(seed)
    expected = np.zeros((NUM_LAYERS, NUM_EXPERTS), np.int64)
    for layer in range(NUM_LAYERS):
        for stage, piece in enumerate(stages):
            size = piece.token_slice.stop - piece.token_slice.start
            ids = torch.randint(0, NUM_EXPERTS, (size, TOP_K), generator=generator)
            expected[layer] += np.bincount(ids.numpy().ravel(), minlength=NUM_EXPERTS)
            runner.connector.send_attn_output(torch.zeros(size, 4), Context(layer, stage, size),
                                              topk_ids=ids, topk_weights=torch.ones(size, TOP_K))
    return expected


def result_of(outputs, routing="natural"):
    return results.build_result(
        case_id="integrations::expert_load", case_kind="stage_e", backend="vllm-ascend",
        settings=RunSettings(split_policy="token_balanced", routing=routing),
        manifest=collect_manifest(topology=TOPOLOGY, backend_name="vllm-ascend",
                                  backend_description={"model": {"num_layers": NUM_LAYERS}},
                                  model_name="deepseek-v3.2", protocol=PROTOCOL, emulated=False),
        workload=results.workload_json(dataset_name="synthetic", prompt_lengths=[sum(SCHEDULED)],
                                       seed=0),
        protocol=PROTOCOL, metrics=results.metrics_from_runs([outputs]),
        evidence=results.evidence_from_outputs(outputs, routing=routing,
                                               num_ep_ranks=TOPOLOGY.num_ep_ranks))


def test_per_stage_counts_round_trip_into_a_schema_valid_result(standin_plugin, connector_class,
                                                               tmp_path):
    seams = standin_plugin("main")
    install_deferred(new_session=new_session_factory(tmp_path))
    runner = make_runner(seams, connector_class)
    expected = run_step(runner, 0) + run_step(runner, 1)
    evidence = read_new_records(tmp_path, {}, max_read_bytes=1 << 20)
    assert evidence.problems == [] and evidence.unmatched_expert_load == 0
    assert [r["step"] for r in evidence.records] == [0, 1]
    step = evidence.records[0]
    assert len(step["expert_load_per_stage_tokens"]) == len(step["ubatches"]) == 2
    assert step["expert_load_per_stage_tokens"] == [
        NUM_LAYERS * TOP_K * u["num_real_tokens"] for u in step["ubatches"]]
    over_http = RunOutputs(requests=[RequestOutput("r0", sum(SCHEDULED), 0, 1, ttft_s=0.1)],
                           wall_time_s=0.2)
    outputs = with_worker_evidence(over_http, evidence, "natural")
    assert np.array_equal(np.asarray(outputs.expert_load), expected)
    doc = result_of(outputs)
    results.validate_result(doc)
    load = doc["evidence"]["expert_load"]
    assert load["routing"] == "natural" and load["per_expert"] == expected.tolist()
    assert load["per_rank"] == expected.reshape(NUM_LAYERS, -1, EXPERT_PER_RANK).sum(-1).tolist()
    assert doc["evidence"]["steps"][0]["expert_load_per_rank"] == step["expert_load_per_rank"]


def test_a_case_whose_workers_routed_otherwise_gets_no_expert_load(standin_plugin,
                                                                  connector_class, tmp_path):
    """The workers ran forced-balanced routing but the case says natural: the reader refuses
    the case's evidence, naming the mismatch, so a synthetic run cannot pass as natural."""
    seams = standin_plugin("main")
    install_deferred(new_session=new_session_factory(tmp_path, routing="forced_balanced"))
    run_step(make_runner(seams, connector_class), 0)
    evidence = read_new_records(tmp_path, {}, max_read_bytes=1 << 20)
    over_http = RunOutputs(requests=[RequestOutput("r0", sum(SCHEDULED), 0, 1, ttft_s=0.1)])
    outputs = with_worker_evidence(over_http, evidence, "natural")
    assert outputs.expert_load == [] and outputs.steps == []
    assert any("forced_balanced" in problem for problem in evidence.problems)


def test_a_line_of_an_earlier_step_is_counted_not_joined(standin_plugin, connector_class,
                                                        tmp_path):
    seams = standin_plugin("main")
    install_deferred(new_session=new_session_factory(tmp_path))
    run_step(make_runner(seams, connector_class), 0)
    lines = (tmp_path / "attention-rank0.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "attention-rank0.jsonl").write_bytes(lines[1])  # the step line is gone
    evidence = read_new_records(tmp_path, {}, max_read_bytes=1 << 20)
    assert evidence.records == [] and evidence.unmatched_expert_load == 1


def _pcp_record(pcp_rank, step, load, dp_rank=0, dispatch_s=0.5):
    """A TP-rank-0 step line after its expert-load line was joined (what the reader holds)."""
    return {"step": step, "ranks": {"global_rank": 8 * dp_rank + pcp_rank, "dp_rank": dp_rank,
                                    "tp_rank": 0, "pcp_rank": pcp_rank},
            "expert_load": load, "expert_load_per_rank": [[sum(row)] for row in load],
            "expert_load_per_stage_tokens": [sum(map(sum, load)), 0],
            "plan_to_last_dispatch_s": dispatch_s}


def test_per_step_load_is_joined_over_the_pcp_ranks():
    """Under PCP each rank routes its own relaid rows: a step's counts are every PCP rank's."""
    from pytest_afd.backends.vllm_ascend.worker_evidence import WorkerEvidence

    loads = {rank: [[rank, 1], [2, rank * 3]] for rank in range(4)}
    records = [_pcp_record(rank, 0, loads[rank], dispatch_s=0.1 * (rank + 1)) for rank in range(4)]
    records.append(_pcp_record(0, 0, [[5, 5], [5, 5]], dp_rank=1))  # another replica, no PCP
    leaders = WorkerEvidence(records=records).leader_records
    assert [(r["ranks"]["dp_rank"], r["step"]) for r in leaders] == [(0, 0), (1, 0)]
    joined = leaders[0]
    assert joined["expert_load"] == [[6, 4], [8, 18]]
    assert joined["expert_load_per_rank"] == [[10], [26]]
    assert joined["expert_load_per_stage_tokens"] == [36, 0]
    assert joined["plan_to_last_dispatch_s"] == pytest.approx(0.4)
    assert joined["expert_load_pcp_ranks"] == [0, 1, 2, 3]
    assert leaders[1]["expert_load"] == [[5, 5], [5, 5]]  # one PCP rank: nothing to join
    assert records[0]["expert_load"] == loads[0]  # the records themselves are not changed


def test_a_step_missing_a_pcp_ranks_load_shows_no_rank_zero_only_counts():
    from pytest_afd.backends.vllm_ascend.worker_evidence import WorkerEvidence

    records = [_pcp_record(rank, step, [[1, 1]]) for rank in range(4) for step in (0, 1)]
    records[-1]["expert_load"] = {"value": None, "absent_reason": "not flushed yet"}
    (first, second) = WorkerEvidence(records=records).leader_records
    assert first["expert_load"] == [[4, 4]]
    assert second["expert_load"]["value"] is None
    assert "PCP ranks [3] have no expert load for step 1" in second["expert_load"]["absent_reason"]
    assert "expert_load_per_rank" not in second and second["expert_load_pcp_ranks"] == [0, 1, 2]
