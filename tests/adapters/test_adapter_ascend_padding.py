"""vLLM-Ascend stage buffers and padding against what the pinned runner and kernels do.

The v0.26.0rc kernel model below is written from the kernel's description in the pinned
data (``runner_buffers.kernel``), sharing no code with the adapter: it counts what
``store_kv_block_metadata`` writes for a stage's slot_mapping and writes it into the
stage's buffers, failing where the real kernel would write past them.
"""

import numpy as np
import pytest
import torch
from adapter_batches import BLOCK, attn_state_enum, build_common, standin_class

from afd_split import SplitConstraints, UnsupportedSplitError, plan_split
from afd_split.engine import common as adapter_common
from afd_split.engine.ascend import ASCEND_LAYOUTS, FIA_PADDING, split_ascend_common_metadata

LAYOUT_IDS = [layout.version for layout in ASCEND_LAYOUTS]
V026 = next(layout for layout in ASCEND_LAYOUTS if layout.version == "v0.26.0rc")
GROUP_FIELDS = ("group_len", "group_key_idx", "group_key_cache_idx")

MANY_RUNS_TOKENS = (100, 20, 20, 20, 20, 20)
"""A tail of five 20-token requests, each over two KV blocks of 16: ten slot runs."""
MANY_RUNS_PLAN = plan_split(
    MANY_RUNS_TOKENS, policy="token_balanced", constraints=SplitConstraints(align=4)
)


def case(layout, tokens, computed, **overrides):
    states = attn_state_enum(layout)
    return build_common(standin_class(layout), layout, tokens, computed,
                        attn_state=states.PrefillNoCache if not any(computed)
                        else states.PrefillCacheHit, **overrides)


def kernel_runs(slot_mapping, block_size):
    """(source index, cache slot, length) of every run store_kv_block_metadata records:
    consecutive non-negative slots within one block; plain Python."""
    runs, index, slots = [], 0, list(slot_mapping)
    while index < len(slots):
        if slots[index] < 0:
            index += 1
            continue
        start = index
        while (index + 1 < len(slots) and slots[index + 1] == slots[index] + 1
               and slots[index + 1] // block_size == slots[start] // block_size):
            index += 1
        index += 1
        runs.append((start, slots[start], index - start))
    return runs


def run_kernel_model(slot_mapping, buffers, block_size):
    """Write the runs into ``buffers`` as the kernel does (unchecked); IndexError past them."""
    runs = kernel_runs(slot_mapping, block_size)
    length, key_idx, cache_idx = (buffer.numpy() for buffer in buffers)
    for entry, (source, slot, count) in enumerate(runs):
        length[entry], key_idx[entry], cache_idx[entry] = count, source, slot
    length[len(runs):] = key_idx[len(runs):] = cache_idx[len(runs):] = 0
    return runs


def test_the_tail_has_more_kernel_entries_than_requests():
    """The case the parent's num_reqs-long view cannot hold: 10 entries for 5 requests."""
    common, _positions, meta = case(V026, MANY_RUNS_TOKENS, (0,) * 6)
    assert MANY_RUNS_PLAN.split_token == 100
    tail = MANY_RUNS_PLAN.ubatches[1]
    slots = meta.slot_mapping[tail.token_slice]
    assert len(kernel_runs(slots, BLOCK)) == 10
    assert tail.request_slice == slice(1, 6)
    assert common.group_len[tail.request_slice].shape[0] == 5


@pytest.mark.parametrize(
    ("tokens", "computed"),
    [(MANY_RUNS_TOKENS, (0,) * 6), ((40, 100, 20, 36), (0, 64, 0, 128)), ((1,) * 8 + (200,), (7,) * 9)],
    ids=["two_blocks_each", "prefix_hits", "one_token_requests"],
)
def test_stage_buffers_hold_everything_the_kernel_writes(tokens, computed):
    common, positions, _meta = case(V026, tokens, computed)
    plan = plan_split(tokens, policy="token_balanced", constraints=SplitConstraints(align=4))
    stages = split_ascend_common_metadata(plan, common, positions, BLOCK, chunked_prefill=False)
    for ubatch, (sub, _) in zip(plan.ubatches, stages, strict=True):
        buffers = [getattr(sub, name) for name in GROUP_FIELDS]
        runs = run_kernel_model(sub.slot_mapping.tolist(), buffers, BLOCK)
        # Every real token of the stage is covered by exactly one run, and store_kv_block
        # (which reads the buffer's whole length) sees every run.
        assert sum(count for _, _, count in runs) == ubatch.num_real_tokens
        assert buffers[0][: len(runs)].tolist() == [count for _, _, count in runs]
        assert (buffers[0][len(runs):] == 0).all()
        assert {buffer.shape[0] for buffer in buffers} == {sub.slot_mapping.shape[0]}
        assert {buffer.dtype for buffer in buffers} == {common.group_len.dtype}
    parent_ptrs = {getattr(common, name).data_ptr() for name in GROUP_FIELDS}
    stage_ptrs = {getattr(sub, name).data_ptr() for sub, _ in stages for name in GROUP_FIELDS}
    assert len(stage_ptrs) == 2 * len(GROUP_FIELDS) and not parent_ptrs & stage_ptrs


def test_a_stage_buffer_sized_like_the_parent_view_is_caught(monkeypatch):
    """Fault injection: the old sizing (empty_like of the parent's num_reqs-long view) is
    overrun by the kernel model on the ten-run tail."""
    monkeypatch.setattr(adapter_common, "fresh_stage_buffer",
                        lambda view, rows: torch.empty_like(view))
    common, positions, _ = case(V026, MANY_RUNS_TOKENS, (0,) * 6)
    stages = split_ascend_common_metadata(MANY_RUNS_PLAN, common, positions, BLOCK,
                                          chunked_prefill=False)
    tail, _ = stages[1]
    with pytest.raises(IndexError):
        run_kernel_model(tail.slot_mapping.tolist(), [getattr(tail, n) for n in GROUP_FIELDS],
                         BLOCK)


def test_pinned_runner_buffers_say_where_they_come_from():
    buffers = V026.extra["runner_buffers"]
    assert buffers["commit"] == V026.commit
    assert set(buffers["fields"]) == set(GROUP_FIELDS)
    assert "max_num_batched_tokens" in buffers["allocated_in"]
    for layout in ASCEND_LAYOUTS:
        layouts = layout.extra["runner_layouts"]
        assert layouts["commit"] == layout.commit
        assert {"unpadded", "sp_padded", "fia_dummy_request"} <= set(layouts)
        assert all(layouts[name]["function"] for name in ("unpadded", "sp_padded",
                                                           "fia_dummy_request", "attn_state"))


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=LAYOUT_IDS)
def test_fia_dummy_request_is_refused_by_name(layout):
    """The FIA layout the runner builds: one dummy request past the real ones holding the
    padding tokens. The split refuses it naming FIA padding, before building anything."""
    common, positions, _ = case(layout, (40, 100, 20, 36), (0, 64, 0, 128), fia_dummy=True)
    assert common.num_reqs == 5 and common.query_start_loc_cpu.tolist()[-2:] == [196, 208]
    plan = plan_split((40, 100, 20, 36), policy="token_balanced",
                      constraints=SplitConstraints(align=8))
    with pytest.raises(UnsupportedSplitError, match=f"{FIA_PADDING}.*padding tokens \\[12\\]"):
        split_ascend_common_metadata(plan, common, positions, BLOCK, chunked_prefill=False)


def test_fia_dummy_request_without_padding_tokens_is_refused():
    """v0.19.1rc1 inserts the dummy even when it holds no tokens; still FIA padding."""
    layout = ASCEND_LAYOUTS[0]
    common, positions, _ = case(layout, (48, 48), (0, 0))
    qsl = torch.cat([common.query_start_loc_cpu, common.query_start_loc_cpu[-1:]])
    common = type(common)(**{**vars(common), "query_start_loc_cpu": qsl,
                             "query_start_loc": qsl.clone(), "num_reqs": 3})
    plan = plan_split((48, 48), policy="token_balanced", constraints=SplitConstraints(align=8))
    with pytest.raises(UnsupportedSplitError, match=f"{FIA_PADDING}.*padding tokens \\[0\\]"):
        split_ascend_common_metadata(plan, common, positions, BLOCK, chunked_prefill=False)


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=LAYOUT_IDS)
def test_sp_padded_parent_has_no_padding_request(layout):
    """The stand-in models the SP layout the runner builds: padding rows, no padding request."""
    common, _, meta = case(layout, (40, 100, 20, 36), (0, 64, 0, 128))
    assert common.num_reqs == meta.num_reqs == 4
    assert common.query_start_loc_cpu.shape[0] == 5
    assert common.num_input_tokens == meta.num_tokens + 12
    assert (np.asarray(common.slot_mapping[meta.num_tokens:]) == -1).all()
