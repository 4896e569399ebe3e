"""vLLM-Ascend specifics on the pinned stand-ins: attn_state, stage-local fields, PCP, drift."""

import importlib.util

import numpy as np
import pytest
import torch
from adapter_batches import BLOCK, PREFIX_HIT_TOKENS, attn_state_enum, build_common, standin_class

from afd_split import SplitConstraints, UnsupportedSplitError, plan_split
from afd_split.engine.ascend import (
    ASCEND_LAYOUTS,
    PcpStage,
    check_ascend_pcp_startup,
    check_ascend_split_support,
    split_ascend_common_metadata,
)
from afd_split.engine.layout import field_names

PLAN = plan_split(PREFIX_HIT_TOKENS, policy="token_balanced", constraints=SplitConstraints(align=8))
LAYOUT_IDS = [layout.version for layout in ASCEND_LAYOUTS]


def case(layout, state="PrefillCacheHit", **overrides):
    states = attn_state_enum(layout)
    common, positions, meta = build_common(
        standin_class(layout), layout, attn_state=states[state], **overrides
    )
    return common, positions, meta, states


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize(
    ("tokens", "computed", "chunked", "expected"),
    [
        # No prefix hit: the head has no context, the tail starts inside request 1.
        ((40, 100, 20, 36), (0, 0, 0, 0), False, ("PrefillNoCache", "PrefillCacheHit")),
        ((40, 100, 20, 36), (0, 0, 0, 0), True, ("PrefillNoCache", "ChunkedPrefill")),
        # Prefix hits on both sides.
        ((40, 100, 20, 36), (0, 64, 0, 128), False, ("PrefillCacheHit", "PrefillCacheHit")),
        # Cut at a request boundary with no context in the tail.
        ((48, 48, 48, 48), (0, 0, 0, 0), False, ("PrefillNoCache", "PrefillNoCache")),
        # A tail of only 1-token requests with cached context: upstream's _build_attn_state
        # picks DecodeOnly for it, whether chunked prefill is on or off.
        ((16, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), (0,) + (30,) * 16, False,
         ("PrefillNoCache", "DecodeOnly")),
        ((16, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), (0,) + (30,) * 16, True,
         ("PrefillNoCache", "DecodeOnly")),
        # 1-token requests without any cached context stay PrefillNoCache (checked first).
        ((16, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), (0,) * 17, True,
         ("PrefillNoCache", "PrefillNoCache")),
        # One 2-token request among the 1-token ones: not DecodeOnly.
        ((16, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2), (0,) + (30,) * 16, False,
         ("PrefillNoCache", "PrefillCacheHit")),
    ],
)
def test_attn_state_is_recomputed_per_ubatch(layout, tokens, computed, chunked, expected):
    """Each ubatch's state equals upstream's rule on that ubatch's own pieces (the reference
    below is written out from _build_attn_state, sharing no code with the adapter)."""
    parent_state = "PrefillNoCache" if not any(computed) else "PrefillCacheHit"
    common, positions, _, states = case(layout, parent_state, tokens=tokens, computed=computed)
    plan = plan_split(tokens, policy="token_balanced", constraints=SplitConstraints(align=8))
    results = split_ascend_common_metadata(plan, common, positions, BLOCK, chunked_prefill=chunked)
    assert tuple(sub.attn_state for sub, _ in results) == tuple(states[name] for name in expected)
    reference = tuple(
        states[upstream_attn_state(query, done, chunked)]
        for query, done in _pieces(tokens, computed, plan.split_token)
    )
    assert reference == tuple(states[name] for name in expected)
    assert common.attn_state is states[parent_state]


def upstream_attn_state(query_lens, computed, chunked):
    """vLLM-Ascend's _build_attn_state (v0.19.1rc1 da421afad719 and v0.26.0rc cf0baa38dfb2,
    model_runner_v1.py), without its speculative branches, on one ubatch scheduled alone."""
    if all(done == 0 for done in computed):
        return "PrefillNoCache"
    if all(query == 1 for query in query_lens):
        return "DecodeOnly"
    return "ChunkedPrefill" if chunked else "PrefillCacheHit"


def _pieces(tokens, computed, cut):
    """Per ubatch, (query lens, computed tokens) of its request pieces; plain Python."""
    head, tail = ([], []), ([], [])
    start = 0
    for query, done in zip(tokens, computed, strict=True):
        stop = start + query
        if stop <= cut:
            head[0].append(query), head[1].append(done)
        elif start >= cut:
            tail[0].append(query), tail[1].append(done)
        else:
            head[0].append(cut - start), head[1].append(done)
            tail[0].append(stop - cut), tail[1].append(done + cut - start)
        start = stop
    return head, tail


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("state", ["DecodeOnly", "SpecDecoding"])
def test_decode_states_are_rejected(layout, state):
    common, positions, _, _ = case(layout, state)
    with pytest.raises(UnsupportedSplitError, match=f"attn_state=.*{state}"):
        split_ascend_common_metadata(PLAN, common, positions, BLOCK, chunked_prefill=False)


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=LAYOUT_IDS)
def test_stage_local_actual_seq_lengths_q_and_host_copies(layout):
    cumulative = np.cumsum(PREFIX_HIT_TOKENS).tolist()
    common, positions, _, _ = case(layout, actual_seq_lengths_q=cumulative)
    (head, _head_pos), (tail, _tail_pos) = split_ascend_common_metadata(
        PLAN, common, positions, BLOCK, chunked_prefill=False
    )
    assert head.actual_seq_lengths_q == [40, 96] and tail.actual_seq_lengths_q == [44, 64, 100]
    assert head._seq_lens_cpu.tolist() == [40, 120] and tail.seq_lens_cpu.tolist() == [164, 20, 164]
    assert tail.num_computed_tokens_cpu.tolist() == [120, 0, 128]
    assert common.actual_seq_lengths_q == cumulative
    assert (head.num_reqs, tail.num_reqs) == (2, 3)


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=LAYOUT_IDS)
def test_unknown_actual_seq_lengths_q_fails_closed(layout):
    common, positions, _, _ = case(layout, actual_seq_lengths_q=[1, 1, 1, 128])
    with pytest.raises(UnsupportedSplitError, match="actual_seq_lengths_q"):
        split_ascend_common_metadata(PLAN, common, positions, BLOCK, chunked_prefill=False)


def test_kernel_output_buffers_are_per_stage():
    layout = ASCEND_LAYOUTS[1]
    common, positions, _, _ = case(layout)
    (head, _), (tail, _) = split_ascend_common_metadata(
        PLAN, common, positions, BLOCK, chunked_prefill=False
    )
    for name in ("group_len", "group_key_idx", "group_key_cache_idx"):
        ptrs = {getattr(sub, name).data_ptr() for sub in (head, tail, common)}
        assert len(ptrs) == 3, f"{name} shared between stages"


def test_positions_cpu_follows_the_stage_rows():
    layout = ASCEND_LAYOUTS[1]
    common, positions, meta, _ = case(layout)
    (head, _), (tail, _) = split_ascend_common_metadata(
        PLAN, common, positions, BLOCK, chunked_prefill=False
    )
    assert head.positions_cpu.tolist() == meta.positions[:96].tolist()
    tail_rows = PLAN.ubatches[1].num_rows  # 100 real tokens padded to 104 rows (align 8)
    assert tail.positions_cpu.tolist() == meta.positions[96:].tolist() + [0] * (tail_rows - 100)


PCP_FIELD = {"v0.19.1rc1": "prefill_context_parallel_metadata", "v0.26.0rc": "context_parallel_metadata"}
PCP_PLAN = plan_split(
    PREFIX_HIT_TOKENS, policy="token_balanced", constraints=SplitConstraints(align=8, pcp_size=2)
)


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=LAYOUT_IDS)
def test_pcp_metadata_without_a_builder_is_rejected_before_anything_is_built(layout):
    field = PCP_FIELD[layout.version]
    common, positions, _, _ = case(layout, **{field: object()})
    with pytest.raises(UnsupportedSplitError, match=f"{field}.*pcp_stage_builder"):
        check_ascend_split_support(common, PCP_PLAN)
    with pytest.raises(UnsupportedSplitError, match="pcp_stage_builder"):
        split_ascend_common_metadata(PCP_PLAN, common, positions, BLOCK, chunked_prefill=False)


def test_pcp_without_a_builder_fails_at_startup_before_any_group_is_created():
    created = []

    def init_group():
        created.append("group")

    with pytest.raises(UnsupportedSplitError, match="prefill context parallel size 8"):
        check_ascend_pcp_startup(pcp_size=8, pcp_stage_builder=None)
        init_group()
    assert created == []
    check_ascend_pcp_startup(pcp_size=8, pcp_stage_builder=lambda stage: {})
    check_ascend_pcp_startup(pcp_size=1, pcp_stage_builder=None)


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=LAYOUT_IDS)
def test_pcp_plan_and_metadata_must_agree(layout):
    common, _positions, _, _ = case(layout)
    with pytest.raises(UnsupportedSplitError, match="pcp_size=2"):
        check_ascend_split_support(common, PCP_PLAN, pcp_stage_builder=lambda stage: {})


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=LAYOUT_IDS)
def test_token_split_with_pcp_goes_through_the_stage_builder(layout):
    """The builder sees stage-local pieces, the tail's computed tokens advanced past the head."""
    field = PCP_FIELD[layout.version]
    common, positions, _, _ = case(layout, **{field: "parent-pcp"})
    stages: list[PcpStage] = []

    def builder(stage):
        stages.append(stage)
        return {field: f"stage-{stage.index}", "slot_mapping": torch.full((stage.num_rows,), -1)}

    results = split_ascend_common_metadata(
        PCP_PLAN, common, positions, BLOCK, chunked_prefill=True, pcp_stage_builder=builder
    )
    head, tail = stages
    assert head.num_scheduled_tokens.tolist() == [40, 56]
    assert tail.num_scheduled_tokens.tolist() == [44, 20, 36]
    assert tail.num_computed_tokens.tolist() == [120, 0, 128]  # 64 cached + 56 in the head
    assert tail.seq_lens.tolist() == [164, 20, 164]
    assert [getattr(sub, field) for sub, _ in results] == ["stage-0", "stage-1"]
    assert [sub.num_input_tokens for sub, _ in results] == [u.num_rows for u in PCP_PLAN.ubatches]
    assert getattr(common, field) == "parent-pcp"


def test_pcp_builder_may_not_set_other_fields():
    layout = ASCEND_LAYOUTS[0]
    common, positions, _, _ = case(layout, prefill_context_parallel_metadata="p")
    with pytest.raises(UnsupportedSplitError, match="seq_lens"):
        split_ascend_common_metadata(
            PCP_PLAN, common, positions, BLOCK, chunked_prefill=False,
            pcp_stage_builder=lambda stage: {"seq_lens": None},
        )


@pytest.mark.skipif(
    importlib.util.find_spec("vllm_ascend") is None,
    reason="vllm_ascend is not installed (it needs torch-npu and CANN): the drift check "
    "against the pinned lists runs on Ascend hardware",
)
def test_installed_vllm_ascend_matches_a_pinned_list():
    from vllm_ascend.attention.utils import AscendCommonAttentionMetadata

    names = field_names(AscendCommonAttentionMetadata)
    assert any(names == layout.fields for layout in ASCEND_LAYOUTS), names
