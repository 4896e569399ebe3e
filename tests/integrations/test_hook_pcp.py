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
import torch
from hook_standins import BLOCK_SIZE, REQUEST_SPLIT, StandInUBatchSlice

from afd_split import UnsupportedSplitError
from afd_split.engine_alignment import EngineAlignment
from afd_split.integrations.afd_plugin.patches import install, install_runner
from afd_split.integrations.afd_plugin.pcp_seam import (
    PCP_STAGE_RULE,
    StageLocalInputBatches,
    rank_local_slices,
)
from afd_split.integrations.afd_plugin.rules import token_balanced_unsupported_reasons
from afd_split.integrations.afd_plugin.stages import (
    TOKEN_BALANCED_SPLIT,
    HookSession,
    plan_stages,
)
from afd_split.integrations.engine_step import StepRanks
from afd_split.integrations.worker_evidence import EvidenceWriter
from afd_split.pcp_stage import zigzag_layout
from tests.afd_split.pcp_helper_reference import helper_metadata

RELEASE = "release/v0.19.1rc1"
PCP = 4
GLOBAL_SCHEDULED = [96, 40, 120, 64]
COMPUTED = [0, 32, 200, 16]  # requests of different cached lengths


def _session_factory(evidence_dir, alignment):
    def new_session(runner) -> HookSession:
        return HookSession(ranks=StepRanks(global_rank=0, pcp_rank=1), groups=[],
                           splitter=lambda *a: pytest.fail("PCP stages never reach the adapter"),
                           writer=EvidenceWriter(evidence_dir, "attention-rank0"),
                           alignment=alignment)

    return new_session


class StandInPcpManager:
    """What the stage rebuild reads: the global counts (query_lens_pcp_full) and the helper."""

    def __init__(self, scheduled, rank):
        self.query_lens_pcp_full = SimpleNamespace(cpu=torch.tensor(scheduled, dtype=torch.int32))
        self.rank = rank

    def generate_pcp_metadata(self, scheduled, input_batch):
        return helper_metadata(scheduled, list(input_batch.num_computed_tokens_cpu), PCP,
                               self.rank)


def _pcp_runner(seams):
    runner = seams.runner_class()
    runner.use_cp = True
    runner.afd_async_extra_info = SimpleNamespace(async_moe_split=TOKEN_BALANCED_SPLIT)
    computed = torch.tensor(COMPUTED, dtype=torch.int32)
    runner.input_batch = SimpleNamespace(num_computed_tokens_cpu_tensor=computed,
                                         num_computed_tokens_cpu=computed.numpy())
    runner.cache_config = SimpleNamespace(block_size=BLOCK_SIZE)
    runner.common = "parent-common"
    runner.long_seq_metadata = "full-batch"
    runner.pcp_manager = StandInPcpManager(GLOBAL_SCHEDULED, rank=1)
    runner.connector = SimpleNamespace()  # the plugin's connector (the expert-load recorder's home)
    return runner


def _rank_local(scheduled):
    return zigzag_layout(np.asarray(scheduled), PCP).rank_tokens.astype(np.int32)


def test_pcp_stages_plan_on_global_counts_and_rebuild_from_stage_local_batches(standin_plugin,
                                                                               tmp_path):
    seams = standin_plugin(RELEASE)
    alignment = EngineAlignment(tp_size=1, sequence_parallel=False, pcp_size=PCP)
    install(seams, new_session=_session_factory(tmp_path, alignment))
    runner = _pcp_runner(seams)
    rebuilt = seams.runner_module.STAGE_REBUILDS
    rank_local = _rank_local(GLOBAL_SCHEDULED)  # what the runner leaves in num_scheduled_tokens_np
    kwargs = {"num_tokens": int(rank_local.sum()), "num_tokens_padded": int(rank_local.sum()),
              "num_scheduled_tokens_np": rank_local, "ubatch_slices": None}
    assert runner._build_attention_metadata_with_async_moe_ubatches((), kwargs, kwargs) == (
        "full-metadata")
    slices = runner._afd_async_moe_ubatch_metadata["ubatch_slices"]
    plan = slices.plan
    assert plan.token_counts.tolist() == GLOBAL_SCHEDULED  # never the rank-local array
    assert plan.boundary_request is None and plan.is_split
    # rank-local rows: each stage's whole requests, contiguous on every rank
    starts = np.concatenate([[0], np.cumsum(rank_local)])
    for ubatch_slice, ubatch in zip(slices, plan.ubatches, strict=True):
        requests = ubatch.request_slice
        assert ubatch_slice.request_slice == requests
        assert ubatch_slice.token_slice == slice(int(starts[requests.start]),
                                                 int(starts[requests.stop]))
    # every stage's rebuild saw its own requests' cached lengths from index 0 (the fix)
    assert [ubid for ubid, _ in rebuilt] == [0, 1]
    for (ubid, metadata), ubatch in zip(rebuilt, plan.ubatches, strict=True):
        requests = ubatch.request_slice
        expected = helper_metadata(GLOBAL_SCHEDULED[requests], COMPUTED[requests], PCP, 1)
        assert metadata == expected, ubid
    assert runner.input_batch.num_computed_tokens_cpu.tolist() == COMPUTED  # restored
    line = json.loads((tmp_path / "attention-rank0.jsonl").read_text().splitlines()[0])
    assert line["pcp_stage_rule"] == PCP_STAGE_RULE
    assert line["constraints"]["pcp_size"] == PCP
    assert line["ranks"]["pcp_rank"] == 1


def test_the_upstream_rebuild_reads_the_first_requests_cached_lengths():
    """Without the stage-local batch, stage 1's helper call reads requests 0.. (upstream bug)."""
    tail = slice(2, 4)
    scheduled = GLOBAL_SCHEDULED[tail]
    whole = SimpleNamespace(num_computed_tokens_cpu=np.asarray(COMPUTED))
    upstream = helper_metadata(scheduled, list(whole.num_computed_tokens_cpu), PCP, 0)
    fixed = helper_metadata(scheduled, COMPUTED[tail], PCP, 0)
    assert upstream["num_computed_tokens_of_pcp_dcp"] != fixed["num_computed_tokens_of_pcp_dcp"]
    runner = SimpleNamespace(input_batch=whole)
    views = [SimpleNamespace(num_computed_tokens_cpu=np.asarray(COMPUTED[:2])),
             SimpleNamespace(num_computed_tokens_cpu=np.asarray(COMPUTED[tail]))]
    seen = []
    for _stage in StageLocalInputBatches(["s0", "s1"], runner, views):
        seen.append(runner.input_batch.num_computed_tokens_cpu.tolist())
    assert seen == [COMPUTED[:2], COMPUTED[tail]]
    assert runner.input_batch is whole


def test_an_abandoned_stage_loop_still_restores_the_runners_batch():
    whole = SimpleNamespace(num_computed_tokens_cpu=np.zeros(2))
    runner = SimpleNamespace(input_batch=whole)
    stages = StageLocalInputBatches(["s0", "s1"], runner, [SimpleNamespace(), SimpleNamespace()])
    iterator = iter(stages)
    next(iterator)
    assert runner.input_batch is not whole
    iterator.close()  # the stage loop raised: the generator is closed
    assert runner.input_batch is whole


def test_rank_local_slices_refuse_a_cut_inside_a_request():
    from afd_split import SplitConstraints, plan_split

    plan = plan_split([200, 10], policy="token_balanced", constraints=SplitConstraints(pcp_size=PCP))
    assert plan.boundary_request == 0
    with pytest.raises(ValueError, match="ubatch 0 cuts a request"):
        rank_local_slices(plan, PCP, StandInUBatchSlice)


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
        install(seams, new_session=_session_factory(None, None))
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
    from afd_split.integrations.afd_plugin.pcp_seam import (
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
    fixed_upstream = source.replace("scheduled, self.input_batch", "scheduled, stage_batch")
    assert "no longer passes self.input_batch" in stage_pcp_rebuild_drift_in(fixed_upstream)
    outside = source.replace("enumerate(ubatch_common_metadata)", "enumerate(ubatch_slices)")
    assert "not called while iterating" in stage_pcp_rebuild_drift_in(outside)


def test_a_drifted_stage_pcp_rebuild_refuses_pcp_at_start(standin_plugin):
    seams = standin_plugin(RELEASE)
    method = vars(seams.runner_class)["_build_attention_metadata_with_ubatches"]

    def drifted(self, *args, **kwargs):  # no inner rebuild any more
        return method(self, *args, **kwargs)

    seams.runner_class._build_attention_metadata_with_ubatches = drifted
    install(seams, new_session=_session_factory(None, None))
    validate = seams.validation_module._fail_if_unsupported_npu_async_moe_ubatching_features
    with pytest.raises(RuntimeError, match="per-stage PCP rebuild drifted"):
        validate(_config(8), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)
    validate(_config(1), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)  # no PCP: accepted


def test_pcp_with_sequence_parallelism_fails_closed_naming_it(standin_plugin, tmp_path):
    seams = standin_plugin(RELEASE)
    alignment = EngineAlignment(tp_size=2, sequence_parallel=True, pcp_size=PCP)
    install(seams, new_session=_session_factory(tmp_path, alignment))
    runner = _pcp_runner(seams)
    rank_local = _rank_local(GLOBAL_SCHEDULED)
    kwargs = {"num_tokens": int(rank_local.sum()), "num_tokens_padded": int(rank_local.sum()),
              "num_scheduled_tokens_np": rank_local, "ubatch_slices": None}
    with pytest.raises(UnsupportedSplitError, match="PCP stages with sequence parallelism"):
        runner._build_attention_metadata_with_async_moe_ubatches((), kwargs, kwargs)
    assert seams.runner_module.STAGE_REBUILDS == []


@pytest.mark.parametrize(("sp", "by_pass", "unit"), [(False, False, 1), (True, False, 4),
                                                     (False, True, 4)])
def test_runner_alignment_reads_vllm_ascends_sp_switches(monkeypatch, sp, by_pass, unit):
    """``enable_sp`` / ``enable_sp_by_pass`` (vllm_ascend.utils at v0.19.1rc1) decide the unit."""
    import sys
    import types

    from afd_split.integrations.afd_plugin.rules import runner_alignment

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
    from afd_split.integrations.afd_plugin.deferred import seam_patches
    from afd_split.integrations.afd_plugin.pinned import (
        EXTRA_INFO_MODULE,
        RUNNER_MODULE,
        VALIDATION_MODULE,
    )

    monkeypatch.setitem(sys.modules, EXTRA_INFO_MODULE,  # what plugin_request_split reads
                        SimpleNamespace(ASYNC_MOE_REQUEST_SPLIT=REQUEST_SPLIT))
    for branch, accepted in ((RELEASE, True), ("main", False)):
        seams = standin_plugin(branch)
        monkeypatch.delitem(sys.modules, RUNNER_MODULE, raising=False)
        patches = seam_patches(_session_factory(None, None))
        assert patches[VALIDATION_MODULE](seams.validation_module)  # runner not loaded yet
        validate = seams.validation_module._fail_if_unsupported_npu_async_moe_ubatching_features
        with pytest.raises(RuntimeError, match="runner module is not loaded"):
            validate(_config(8), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)
        monkeypatch.setitem(sys.modules, RUNNER_MODULE, seams.runner_module)  # the runner loads
        # what the hook's runner patch does (seams_of needs the real vLLM package)
        assert install_runner(seams, new_session=_session_factory(None, None)) == branch
        if accepted:
            validate(_config(8), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)
        else:
            with pytest.raises(RuntimeError, match="main has no per-stage PCP rebuild"):
                validate(_config(8), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)
        validate(_config(1), GATE, num_ubatches=2, split=TOKEN_BALANCED_SPLIT)  # no PCP
