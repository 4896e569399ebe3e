"""The hook under PCP (release/v0.19.1rc1 seam) and with SP alignment, on pinned stand-ins.

The release stand-in's stage build models the pinned facts of
``_build_attention_metadata_with_ubatches`` (afd-plugin release/v0.19.1rc1 2f4f462):
it iterates the runner module's ``split_attn_metadata`` result and, per stage,
runs the inner stage-PCP rebuild, whose ``generate_pcp_metadata`` call reads
``self.input_batch.num_computed_tokens_cpu`` from index 0 (vllm-ascend
v0.19.1rc1 da421afad719). The helper maths is the independent reference of
``tests/afd_split/pcp_helper_reference.py``.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from afd_split import UnsupportedSplitError
from afd_split.hook.facts.drift_guard import PATCH_MARKER, TOKEN_BALANCED_SPLIT
from afd_split.hook.facts.pinned import PLANNER, VALIDATOR
from afd_split.hook.glue.pcp_seam import PCP_STAGE_RULE, StageBlockTables
from afd_split.hook.install import install_deferred
from afd_split.hook.planning.engine_step import StepRanks
from afd_split.hook.planning.rules import token_balanced_unsupported_reasons
from afd_split.hook.planning.stages import HookSession, plan_stages
from afd_split.hook.planning.worker_evidence import EvidenceWriter
from afd_split.pcp.alignment import EngineAlignment
from afd_split.pcp.stage import stage_tokens
from tests.support.hook_pcp_runner import RELEASE, pcp_runner, session_factory
from tests.support.hook_standins import BLOCK_SIZE, StandInUBatchSlice
from tests.support.pcp_helper_reference import helper_metadata, helper_padded_slots
from tests.support.pcp_runner_model import runner_batch
from tests.support.pcp_standins import block_tables

PCP = 4
GLOBAL_SCHEDULED = [96, 40, 120, 64]
COMPUTED = [0, 32, 200, 16]  # requests of different cached lengths
CUT_CASES = [
    # (scheduled, computed, pcp): a cut inside a prefix-hit request, one long request,
    # leading decodes then a cut, a one-token tail followed by a one-token request
    (GLOBAL_SCHEDULED, COMPUTED, PCP),
    ([700], [128], 8),
    ([1, 1, 90, 33], [40, 7, 0, 5], 2),
    ([2, 3, 1, 1, 1], [0, 5, 2, 0, 4], 2),
]


def _plan_step(seams, scheduled, computed, pcp, rank, evidence_dir=None):
    install_deferred(new_session=session_factory(
        evidence_dir, EngineAlignment(tp_size=1, sequence_parallel=False, pcp_size=pcp), rank))
    runner, batch = pcp_runner(seams, scheduled, computed, pcp, rank)
    rank_rows = np.array(batch.rank_rows, dtype=np.int32)  # what _prepare_inputs leaves
    kwargs = {"num_tokens": int(rank_rows.sum()), "num_tokens_padded": int(rank_rows.sum()),
              "num_reqs": len(scheduled), "num_scheduled_tokens_np": rank_rows,
              "ubatch_slices": None}
    assert runner._build_attention_metadata_with_async_moe_ubatches((), kwargs, kwargs) == (
        "full-metadata")
    return runner, batch


@pytest.mark.parametrize(("scheduled", "computed", "pcp"), CUT_CASES)
def test_a_cut_request_gets_head_alone_and_tail_continuation_pcp_metadata(
        standin_plugin, scheduled, computed, pcp):
    for rank in range(pcp):
        seams = standin_plugin(RELEASE)
        runner, batch = _plan_step(seams, scheduled, computed, pcp, rank)
        slices = runner._afd_async_moe_ubatch_metadata["ubatch_slices"]
        plan = slices.plan
        assert plan.token_counts.tolist() == scheduled  # never the rank-local array
        assert plan.boundary_request is not None  # cut inside a request
        rebuilt = dict(seams.runner_module.STAGE_REBUILDS)
        assert sorted(rebuilt) == [0, 1]
        for ubid, stage in enumerate(stage_tokens(plan, computed)):
            pieces = stage.num_scheduled_tokens.tolist()
            context = stage.num_computed_tokens.tolist()  # the tail's includes the head
            built = rebuilt[ubid]
            metadata = vars(built.prefill_context_parallel_metadata)
            expected = helper_metadata(pieces, context, pcp, rank)
            for key, value in expected.items():
                got = metadata[key]
                got = got.tolist() if hasattr(got, "tolist") else got
                if key == "num_computed_tokens_of_pcp_dcp":
                    got = [[ranks[0] for ranks in request] for request in got]
                assert got == value, (rank, ubid, key)
            stage_slots = batch.global_slots[stage.token_start:stage.token_start + stage.num_tokens]
            assert built.slot_mapping.tolist() == helper_padded_slots(pieces, pcp,
                                                                      stage_slots.tolist())
            alone = runner_batch(pieces, context, pcp, rank, block_size=BLOCK_SIZE)
            assert built.query_start_loc_cpu.tolist() == alone.common.query_start_loc_cpu.tolist()
            assert built._seq_lens_cpu.tolist() == alone.common._seq_lens_cpu.tolist()
            assert built.positions.tolist() == alone.positions.tolist()
            assert built.num_actual_tokens == alone.common.num_actual_tokens
        for ubatch_slice, rows in zip(slices, slices.pcp.relayout.stage_row_slices, strict=True):
            assert ubatch_slice.token_slice == rows  # the relaid rows, not the parent's
        # the runner's own state is back: batch, counts, full-batch PCP metadata
        assert runner.input_batch.num_computed_tokens_cpu.tolist() == computed
        assert runner.pcp_manager.query_lens_pcp_full.cpu[:len(scheduled)].tolist() == scheduled
        assert runner.pcp_manager.query_lens_pcp_full.gpu[:len(scheduled)].tolist() == scheduled
        assert runner.long_seq_metadata == "full-batch"


def test_the_step_line_records_the_relayout(standin_plugin, tmp_path):
    seams = standin_plugin(RELEASE)
    _plan_step(seams, GLOBAL_SCHEDULED, COMPUTED, PCP, 1, evidence_dir=tmp_path)
    line = json.loads((tmp_path / "attention-rank0.jsonl").read_text().splitlines()[0])
    assert line["pcp_stage_rule"] == PCP_STAGE_RULE
    # the ids in batch order, and the GLOBAL schedule the plan cut (never the rank's rows)
    assert line["request_ids"] == [f"cmpl-q{i}-0" for i in range(len(GLOBAL_SCHEDULED))]
    assert line["schedule"]["num_scheduled_tokens"] == GLOBAL_SCHEDULED
    assert line["schedule"]["num_computed_tokens"] == COMPUTED
    assert line["constraints"]["pcp_size"] == PCP
    assert line["ranks"]["pcp_rank"] == 1
    assert line["pcp_relayout"]["exchanged_requests"] == [line["boundary_request"]]
    assert sum(line["pcp_relayout"]["stage_rank_rows"]) >= line["pcp_relayout"]["parent_rank_rows"]


def test_the_upstream_rebuild_without_the_stage_local_batch_is_caught(standin_plugin,
                                                                      monkeypatch):
    """Fault injection: upstream's whole-batch input_batch (stage 1 reads requests 0..'s cached
    lengths from index 0) makes the rebuilt context differ, and the step fails closed."""
    from afd_split.hook.glue import pcp_seam

    monkeypatch.setattr(pcp_seam, "stage_input_batch",
                        lambda batch, stage: SimpleNamespace(
                            num_computed_tokens_cpu=batch.num_computed_tokens_cpu,
                            block_table=pcp_seam.StageBlockTables(batch.block_table,
                                                                  stage.token_start)))
    with pytest.raises(UnsupportedSplitError, match="context tokens"):
        _plan_step(standin_plugin(RELEASE), GLOBAL_SCHEDULED, COMPUTED, PCP, 1)


def test_whole_request_counts_in_the_rebuild_are_caught(standin_plugin, monkeypatch):
    """Fault injection: the rebuild reading its requests' whole counts, not the pieces'."""
    from afd_split.hook.glue import pcp_seam

    def whole_requests(stage, num_reqs):
        counts = np.zeros(num_reqs, dtype=np.int64)
        requests = slice(stage.request_start, stage.request_start + len(stage.num_scheduled_tokens))
        counts[requests] = np.asarray(GLOBAL_SCHEDULED)[requests]
        return counts

    monkeypatch.setattr(pcp_seam, "stage_scheduled_counts", whole_requests)
    with pytest.raises(UnsupportedSplitError, match="query_lens_pcp_full"):
        _plan_step(standin_plugin(RELEASE), GLOBAL_SCHEDULED, COMPUTED, PCP, 1)


def test_an_abandoned_stage_loop_still_restores_the_runners_state(standin_plugin):
    seams = standin_plugin(RELEASE)
    runner, _ = _plan_step(seams, GLOBAL_SCHEDULED, COMPUTED, PCP, 0)
    pcp = runner._afd_async_moe_ubatch_metadata["ubatch_slices"].pcp
    whole = runner.input_batch
    iterator = iter(pcp.split(runner.common))
    next(iterator)
    assert runner.input_batch is not whole
    assert runner.pcp_manager.query_lens_pcp_full.cpu[:4].tolist() != GLOBAL_SCHEDULED
    iterator.close()  # the stage loop raised: the generator is closed
    assert runner.input_batch is whole
    assert runner.pcp_manager.query_lens_pcp_full.cpu[:4].tolist() == GLOBAL_SCHEDULED


def test_a_stage_block_table_exposes_only_the_slot_rows():
    tables = block_tables(np.arange(10))
    view = StageBlockTables(tables, 4)
    assert view[0].slot_mapping.gpu[:3].tolist() == [4, 5, 6]
    with pytest.raises(AttributeError):
        view[0].block_table  # noqa: B018 - an upstream read beyond the slots fails loudly


def _config(pcp, *, dcp=1, spec=None, model_type="deepseek_v32"):
    return SimpleNamespace(
        parallel_config=SimpleNamespace(decode_context_parallel_size=dcp,
                                        prefill_context_parallel_size=pcp, tensor_parallel_size=1,
                                        enable_dbo=False),
        model_config=SimpleNamespace(hf_text_config=SimpleNamespace(to_dict=lambda: {
            "index_topk": 2048}), hf_config=SimpleNamespace(model_type=model_type),
            enforce_eager=True),
        speculative_config=spec)


GATE = SimpleNamespace(compute_gate_on_attention=True)


def test_validator_rules_for_pcp():
    assert token_balanced_unsupported_reasons(_config(8), GATE, 2, None) == []
    main = token_balanced_unsupported_reasons(_config(8), GATE, 2)
    assert main and "no afd-plugin per-stage PCP rebuild was checked" in main[0]
    hybrid = token_balanced_unsupported_reasons(_config(8, model_type="qwen3_next"), GATE, 2,
                                                None)
    assert any("hybrid attention" in reason for reason in hybrid)
    dcp = token_balanced_unsupported_reasons(_config(8, dcp=2), GATE, 2, None)
    assert any("decode_context_parallel_size=2" in reason for reason in dcp)


def test_validator_patch_accepts_pcp_only_on_the_release_seams(standin_plugin):
    for branch, accepted in ((RELEASE, True), ("main", False)):
        seams = standin_plugin(branch)
        install_deferred(new_session=session_factory(None, None))
        validate = seams.validation_module._fail_if_unsupported_npu_async_moe_ubatching_features
        if accepted:
            validate(_config(8), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)
        else:
            with pytest.raises(RuntimeError, match="prefill_context_parallel_size=8 > 1"):
                validate(_config(8), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)


def _sp_session(tmp_path):
    return HookSession(ranks=StepRanks(global_rank=0), groups=[], splitter=None,
                       writer=EvidenceWriter(tmp_path, "attention-rank0"),
                       alignment=EngineAlignment(tp_size=4, sequence_parallel=True))


def test_sp_stages_are_tp_aligned_with_the_parents_padding_on_the_tail(tmp_path):
    session = _sp_session(tmp_path)
    stages = plan_stages(session, np.array([2019]), num_computed_tokens=np.zeros(1, dtype=np.int64),
                         block_size=BLOCK_SIZE, slice_type=StandInUBatchSlice, num_input_tokens=2020)
    head, tail = stages.plan.ubatches
    assert [s.token_slice for s in stages] == [slice(0, 1008), slice(1008, 2020)]
    assert (head.num_padded_tokens, tail.num_padded_tokens) == (0, 1)
    line = json.loads((tmp_path / "attention-rank0.jsonl").read_text())
    assert [(u["num_real_tokens"], u["num_padded_tokens"]) for u in line["ubatches"]] == [
        (1008, 0), (1011, 1)]
    assert "tp=4 SP on" in line["alignment"]


def test_an_unaligned_parent_fails_closed_before_any_agreement(tmp_path):
    session = _sp_session(tmp_path)
    session.check_agreement = True
    session.groups = [object()]  # an agreement collective here would fail loudly
    with pytest.raises(UnsupportedSplitError, match="num_input_tokens=2019"):
        plan_stages(session, np.array([2019]), num_computed_tokens=np.zeros(1, dtype=np.int64),
                    block_size=BLOCK_SIZE, slice_type=StandInUBatchSlice, num_input_tokens=2019)
    assert session.steps_planned == 0
    evidence = tmp_path / "attention-rank0.jsonl"
    assert not evidence.exists() or evidence.read_text() == ""  # no line for a refused step


def test_the_stage_pcp_rebuild_is_drift_checked(standin_plugin):
    from afd_split.hook.facts.pcp_drift import (
        STAGE_BUILD_METHOD,
        pcp_seam_unavailable,
        stage_pcp_rebuild_drift_in,
    )

    seams = standin_plugin(RELEASE)
    assert pcp_seam_unavailable(seams.runner_class, RELEASE) is None
    assert "has no per-stage PCP rebuild" in pcp_seam_unavailable(seams.runner_class, "main")
    source = __import__("inspect").getsource(vars(seams.runner_class)[STAGE_BUILD_METHOD])
    renamed = source.replace("attn_gid: int", "attn_group_id: int")
    assert "header is" in stage_pcp_rebuild_drift_in(renamed)
    fixed_upstream = source.replace("            self.input_batch, rank_rows,",
                                    "            stage_batch, rank_rows,")
    assert fixed_upstream != source
    assert "no longer passes self.input_batch" in stage_pcp_rebuild_drift_in(fixed_upstream)
    outside = source.replace("enumerate(ubatch_common_metadata)", "enumerate(ubatch_slices)")
    assert "not called while iterating" in stage_pcp_rebuild_drift_in(outside)
    # what StageLocalInputBatches sets up per stage must still be what the rebuild reads
    for read, other in (("self.pcp_manager.query_lens_pcp_full.cpu", "self.pcp_manager.counts"),
                        (".slot_mapping.gpu[", ".slots.gpu["),
                        ("int(common_attn_metadata.num_actual_tokens)", "int(rows)")):
        assert read in source
        assert "no longer reads" in stage_pcp_rebuild_drift_in(source.replace(read, other))


def test_a_drifted_stage_pcp_rebuild_refuses_pcp_at_start(standin_plugin):
    seams = standin_plugin(RELEASE)
    method = vars(seams.runner_class)["_build_attention_metadata_with_ubatches"]

    def drifted(self, *args, **kwargs):  # no inner rebuild any more
        return method(self, *args, **kwargs)

    seams.runner_class._build_attention_metadata_with_ubatches = drifted
    install_deferred(new_session=session_factory(None, None))
    validate = seams.validation_module._fail_if_unsupported_npu_async_moe_ubatching_features
    with pytest.raises(RuntimeError, match="per-stage PCP rebuild drifted"):
        validate(_config(8), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)
    validate(_config(1), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)  # no PCP: accepted


def test_pcp_with_sequence_parallelism_fails_closed_naming_it(standin_plugin, tmp_path):
    seams = standin_plugin(RELEASE)
    alignment = EngineAlignment(tp_size=2, sequence_parallel=True, pcp_size=PCP)
    install_deferred(new_session=session_factory(tmp_path, alignment))
    runner, batch = pcp_runner(seams, GLOBAL_SCHEDULED, COMPUTED, PCP, 1)
    rank_local = np.array(batch.rank_rows, dtype=np.int32)
    kwargs = {"num_tokens": int(rank_local.sum()), "num_tokens_padded": int(rank_local.sum()),
              "num_reqs": 4, "num_scheduled_tokens_np": rank_local, "ubatch_slices": None}
    with pytest.raises(UnsupportedSplitError, match="PCP stages with sequence parallelism"):
        runner._build_attention_metadata_with_async_moe_ubatches((), kwargs, kwargs)
    assert seams.runner_module.STAGE_REBUILDS == []


@pytest.mark.parametrize(("sp", "by_pass", "unit"), [(False, False, 1), (True, False, 4),
                                                     (False, True, 4)])
def test_runner_alignment_reads_vllm_ascends_sp_switches(monkeypatch, sp, by_pass, unit):
    """``enable_sp`` / ``enable_sp_by_pass`` (vllm_ascend.utils at v0.19.1rc1) decide the unit."""
    import sys
    import types

    from afd_split.hook.planning.rules import runner_alignment

    utils = types.ModuleType("vllm_ascend.utils")
    seen = []
    utils.enable_sp = lambda vllm_config: seen.append(vllm_config) or sp
    utils.enable_sp_by_pass = lambda: by_pass
    monkeypatch.setitem(sys.modules, "vllm_ascend", types.ModuleType("vllm_ascend"))
    monkeypatch.setitem(sys.modules, "vllm_ascend.utils", utils)
    config = SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=4,
                                                             prefill_context_parallel_size=1))
    alignment = runner_alignment(config)
    assert seen == [config]
    assert (alignment.tp_size, alignment.pcp_size, alignment.row_unit) == (4, 1, unit)


def test_deferred_validator_judges_pcp_from_the_runner_loaded_when_it_runs(standin_plugin,
                                                                           monkeypatch):
    """Deferred registration patches the validation module when it loads, before the
    Attention worker loads the runner module: PCP is judged when the validator runs."""
    from afd_split.hook.facts.pinned import RUNNER_MODULE

    for branch, accepted in ((RELEASE, True), ("main", False)):
        seams = standin_plugin(branch)
        monkeypatch.delitem(sys.modules, RUNNER_MODULE)  # the runner module is not loaded yet
        install_deferred(new_session=session_factory(None, None))
        validate = seams.validation_module._fail_if_unsupported_npu_async_moe_ubatching_features
        assert getattr(validate, PATCH_MARKER) == VALIDATOR
        with pytest.raises(RuntimeError, match="runner module is not loaded"):
            validate(_config(8), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)
        monkeypatch.setitem(sys.modules, RUNNER_MODULE, seams.runner_module)  # the runner loads
        install_deferred(new_session=session_factory(None, None))  # as the import hook does
        planner = vars(seams.runner_class)["_build_attention_metadata_with_async_moe_ubatches"]
        assert getattr(planner, PATCH_MARKER) == PLANNER
        if accepted:
            validate(_config(8), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)
        else:
            with pytest.raises(RuntimeError, match="main has no per-stage PCP rebuild"):
                validate(_config(8), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)
        validate(_config(1), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)  # no PCP
