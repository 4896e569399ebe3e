"""Stage-local PCP metadata equals vLLM-Ascend's helper (independent reference) per stage."""

from __future__ import annotations

import numpy as np
import pytest

from afd_split import SplitConstraints, UnsupportedSplitError, plan_split
from afd_split.pcp.stage import (
    PAD_TOKEN,
    check_pcp_stage_support,
    padded_slot_mapping,
    stage_rows,
    stage_tokens,
    token_ranks,
    zigzag_layout,
)
from afd_split.pcp.stage_metadata import _kv_index_ranges, _rank_block_ranges, stage_metadata
from tests.support.pcp_helper_reference import (
    helper_layout,
    helper_metadata,
    helper_padded_slots,
)

PCP_SIZES = (2, 4, 8)


def as_reference(metadata) -> dict:
    """``PcpStageMetadata`` in the reference's plain-list form."""
    return {
        "num_actual_tokens_pcp_padded": metadata.num_actual_tokens_pcp_padded,
        "num_computed_tokens_of_pcp_dcp": metadata.num_computed_tokens_of_pcp_dcp[:, :, 0].tolist(),
        "pcp_unpad_mask": metadata.pcp_unpad_mask.tolist(),
        "query_lens_pcp_full_cpu": metadata.query_lens_pcp_full_cpu.tolist(),
        "max_query_len_pcp_full": metadata.max_query_len_pcp_full,
        "pcp_allgather_restore_idx": metadata.pcp_allgather_restore_idx.tolist(),
        "q_head_idx": metadata.q_head_idx.tolist(),
        "q_tail_idx": metadata.q_tail_idx.tolist(),
        "q_full_idx": metadata.q_full_idx.tolist(),
        "kv_idx": {name: values.tolist() for name, values in metadata.kv_idx.items()},
        "attn_chunk_seqlens": metadata.attn_chunk_seqlens.tolist(),
        "attn_mask_seqlens": metadata.attn_mask_seqlens,
        "head_attn_nomask_seqlens": metadata.head_attn_nomask_seqlens,
        "tail_attn_nomask_seqlens": metadata.tail_attn_nomask_seqlens,
        "head_actual_seq_lengths_kv": metadata.head_actual_seq_lengths_kv,
        "tail_actual_seq_lengths_kv": metadata.tail_actual_seq_lengths_kv,
    }


def test_layout_matches_the_helpers_docstring_example():
    # update_tokens_for_pcp's own example: tokens [1, 5, 8], pcp 2.
    layout = zigzag_layout([1, 5, 8], 2)
    assert layout.rank_tokens.tolist() == [1, 4, 4]
    assert layout.num_pads.tolist() == [1, 3, 0]
    assert layout.unpad_mask.tolist() == [True, False, True, True, True, True, True, False,
                                          False, False] + [True] * 8
    assert layout.allgather_restore_idx.tolist() == [0, 9, 1, 2, 10, 11, 12, 13, 3, 4, 5, 6,
                                                     14, 15, 16, 17, 7, 8]
    reference = helper_layout([1, 5, 8], 2)
    assert layout.padded_offsets.tolist() == reference["rank_rows"]
    assert layout.rank_sources.tolist() == reference["sources"]


@pytest.mark.parametrize("pcp", PCP_SIZES)
def test_batch_metadata_equals_the_helper_on_random_batches(pcp):
    rng = np.random.default_rng(pcp)
    for _ in range(25):
        num_reqs = int(rng.integers(1, 6))
        scheduled = rng.integers(1, 70, num_reqs)
        scheduled[: int(rng.integers(0, 2))] = 1  # sometimes a leading decode
        computed = rng.integers(0, 300, num_reqs)
        interleave = int(rng.choice([1, 2, 16]))
        stage = stage_tokens(plan_split(scheduled, policy="none"), computed)[0]
        for rank in range(pcp):
            ours = as_reference(stage_metadata(stage, pcp, rank, interleave=interleave))
            assert ours == helper_metadata(scheduled.tolist(), computed.tolist(), pcp, rank,
                                           interleave)


def cut_inside(counts, pcp):
    plan = plan_split(counts, policy="token_balanced", constraints=SplitConstraints(pcp_size=pcp))
    assert plan.boundary_request is not None, plan
    return plan


@pytest.mark.parametrize("pcp", PCP_SIZES)
def test_cut_request_head_alone_and_tail_as_continuation(pcp):
    counts = np.array([40, 500, 30])
    computed = np.array([16, 64, 0])
    plan = cut_inside(counts, pcp)
    boundary = plan.boundary_request
    head, tail = stage_tokens(plan, computed)
    # The head is the batch's first requests with the cut request's first part, scheduled alone;
    # the tail is its continuation: computed advanced by the head's share.
    head_batch = ([*counts[:boundary], plan.head_tokens], list(computed[: boundary + 1]))
    tail_batch = ([plan.tail_tokens, *counts[boundary + 1:]],
                  [computed[boundary] + plan.head_tokens, *computed[boundary + 1:]])
    assert head.num_scheduled_tokens.tolist() == head_batch[0]
    assert head.num_computed_tokens.tolist() == head_batch[1]
    assert tail.num_scheduled_tokens.tolist() == tail_batch[0]
    assert tail.num_computed_tokens.tolist() == tail_batch[1]
    for stage, (scheduled, cached) in ((head, head_batch), (tail, tail_batch)):
        for rank in range(pcp):
            assert as_reference(stage_metadata(stage, pcp, rank)) == helper_metadata(
                [int(n) for n in scheduled], [int(c) for c in cached], pcp, rank)


def test_whole_batch_input_batch_gives_the_tail_the_first_requests_cached_lengths():
    # The upstream stage-local PCP path hands the helper the whole batch's input_batch: it reads
    # num_computed_tokens_cpu from index 0, so the tail stage gets requests 0.. 's cached lengths.
    pcp = 2
    counts = np.array([100, 100, 100])
    computed = np.array([0, 48, 96])
    plan = plan_split(counts, policy="token_balanced", constraints=SplitConstraints(pcp_size=pcp))
    tail = stage_tokens(plan, computed)[1]
    scheduled = [int(n) for n in tail.num_scheduled_tokens]
    upstream = helper_metadata(scheduled, computed.tolist(), pcp, 0)
    fixed = helper_metadata(scheduled, tail.num_computed_tokens.tolist(), pcp, 0)
    ours = as_reference(stage_metadata(tail, pcp, 0))
    assert ours == fixed
    assert ours["num_computed_tokens_of_pcp_dcp"] != upstream["num_computed_tokens_of_pcp_dcp"]
    # cached tokens over the ranks add up to the tail pieces' own context
    held = stage_metadata(tail, pcp, 0).num_computed_tokens_of_pcp_dcp.sum(axis=(1, 2))
    assert held.tolist() == tail.num_computed_tokens.tolist()


def test_padded_slots_equal_the_helper():
    scheduled = [1, 7, 19]
    slots = list(range(100, 127))
    layout = zigzag_layout(scheduled, 4)
    assert padded_slot_mapping(layout, np.array(slots)).tolist() == helper_padded_slots(
        scheduled, 4, slots)
    with pytest.raises(ValueError, match="slot_mapping has 3 entries"):
        padded_slot_mapping(layout, np.arange(3))


@pytest.mark.parametrize("pcp", PCP_SIZES)
def test_stage_rows_hold_every_token_once_and_slice_per_stage(pcp):
    counts = np.array([40, 500, 30])
    plan = cut_inside(counts, pcp)
    rows = stage_rows(plan, np.zeros(3, dtype=np.int64), pcp)
    sources = rows.rank_sources
    real = sources[sources != PAD_TOKEN]
    assert sorted(real.tolist()) == list(range(int(counts.sum())))  # no decodes here
    for ubatch, row_slice in zip(plan.ubatches, rows.rank_row_slices, strict=True):
        block = sources[:, row_slice]
        inside = block[block != PAD_TOKEN]
        assert inside.min() >= ubatch.token_slice.start
        assert inside.max() < ubatch.token_slice.stop
        assert block.shape[1] * pcp == ubatch.num_rows  # the planner's PCP rows per stage
    # the cut request is zigzagged twice: its tokens change rank, and its two pieces pad
    # pad(a) + pad(b) = pad(a + b) mod 2 * pcp, each below 2 * pcp: 0 or 2 * pcp extra rows
    assert rows.moved_tokens > 0
    assert rows.extra_pad_rows in (0, 2 * pcp)


def test_request_boundary_cut_keeps_the_whole_request_layout():
    counts = np.array([64, 64])
    plan = plan_split(counts, policy="request_boundary",
                      constraints=SplitConstraints(pcp_size=4))
    rows = stage_rows(plan, np.zeros(2, dtype=np.int64), 4)
    whole = zigzag_layout(counts, 4)
    assert rows.moved_tokens == 0 and rows.extra_pad_rows == 0
    assert rows.rank_sources.tolist() == whole.rank_sources.tolist()


def test_token_ranks_names_the_rank_of_each_token():
    layout = zigzag_layout([1, 8], 2)  # a decode (real copy on rank 0), then chunks 0,3 | 1,2
    assert token_ranks(layout).tolist() == [0, 0, 0, 1, 1, 1, 1, 0, 0]


def test_unmodelled_pcp_settings_fail_closed_by_name():
    check_pcp_stage_support(pcp_size=1, dcp_size=4, num_speculative_tokens=2,
                            hybrid_attention=True)  # no PCP: nothing to refuse here
    with pytest.raises(UnsupportedSplitError, match="decode_context_parallel_size=2") as error:
        check_pcp_stage_support(pcp_size=8, dcp_size=2, num_speculative_tokens=1,
                                hybrid_attention=True)
    assert "num_speculative_tokens=1" in str(error.value)
    assert "hybrid attention" in str(error.value)


@pytest.mark.parametrize("pcp", PCP_SIZES)
def test_rank_rows_all_gathered_and_restored_are_the_stage_in_order(pcp):
    from afd_split.pcp.rows import gathered_stage_rows, rank_rows

    layout = zigzag_layout([1, 37, 64, 5], pcp)
    tokens = np.arange(107) + 1000
    per_rank = [rank_rows(layout, rank, tokens, pad_value=-1) for rank in range(pcp)]
    assert {len(rows) for rows in per_rank} == {layout.rows_per_rank}  # equal rows per rank
    restored = gathered_stage_rows(layout, tokens, pad_value=-1)
    assert restored[layout.unpad_mask].tolist() == tokens.tolist()
    others = restored[~layout.unpad_mask]
    assert (others == tokens[0]).sum() == pcp - 1  # the decode's copies on the other ranks
    assert (others == -1).sum() == len(others) - (pcp - 1)  # the rest is padding


def _reference_rank_ranges(starts, lengths) -> list:
    """Per rank (row of the broadcast arrays): its blocks' indices, one block at a time."""
    starts, lengths = np.broadcast_arrays(np.atleast_2d(starts), np.atleast_2d(lengths))
    return [np.array([start + offset for start, length in zip(row_starts, row_lengths,
                                                              strict=True)
                      for offset in range(int(length))], dtype=np.int64)
            for row_starts, row_lengths in zip(starts, lengths, strict=True)]


@pytest.mark.parametrize("pcp", PCP_SIZES)
def test_kv_index_ranges_in_one_pass_equal_each_ranks_own_blocks(pcp):
    """The one-pass kv index ranges (issue 43's host cost) equal a per-block reference, for
    every rank, and each rank's array is its own (a write to one never reaches another)."""
    rng = np.random.default_rng(100 + pcp)
    head = np.arange(pcp, dtype=np.int64)[:, None]
    for _ in range(40):
        requests = int(rng.integers(0, 5))  # 0: a stage of decodes only has no prefill rows
        chunk = rng.integers(0, 9, requests).astype(np.int64)
        offset = (np.cumsum(chunk) - chunk) * pcp
        tail = 2 * pcp - 1 - head
        specs = {"head": (offset, chunk * head), "mask": (offset + chunk * head, chunk),
                 "tail": (np.cumsum(chunk * tail, axis=1), chunk * (tail + 1))}
        ranges = _kv_index_ranges(specs, pcp, requests)
        arrays = []
        for name, (starts, lengths) in specs.items():
            assert len(ranges[name]) == pcp
            for ours, theirs in zip(ranges[name], _reference_rank_ranges(starts, lengths),
                                    strict=True):
                assert ours.dtype == np.int64 and ours.tolist() == theirs.tolist()
            assert [a.tolist() for a in _rank_block_ranges(starts, lengths)] == [
                a.tolist() for a in ranges[name]]
            arrays += ranges[name]
        assert not any(np.shares_memory(a, b) for i, a in enumerate(arrays)
                       for b in arrays[i + 1:])
