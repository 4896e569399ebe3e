"""One PCP rank's metadata of a split stage scheduled alone (numpy only): the host values
of vLLM-Ascend's ``AscendPrefillContextParallelMetadata`` as its PCP helper builds them
(vllm-ascend v0.19.1rc1 da421af ``vllm_ascend/worker/pcp_utils.py``; tests hold it
against an independent reference of the helper's maths). The layout it reads is
:mod:`afd_split.pcp.stage`'s zigzag.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from afd_split.pcp.stage import PcpStageTokens, ZigzagLayout, block_ranges, zigzag_layout
from afd_split.plan.constraints import ZIGZAG_CHUNKS_PER_RANK

DEFAULT_CP_KV_CACHE_INTERLEAVE_SIZE = 1


def cp_local_context_lens(context_lens: np.ndarray, pcp_size: int,
                          interleave: int = DEFAULT_CP_KV_CACHE_INTERLEAVE_SIZE) -> np.ndarray:
    """Cached tokens each PCP rank holds per request ([R, pcp, 1]; DCP 1), interleaved by
    ``cp_kv_cache_interleave_size``."""
    context = np.asarray(context_lens, dtype=np.int64)[:, None]
    ranks = np.arange(pcp_size, dtype=np.int64)[None, :]
    base = context // interleave // pcp_size * interleave
    remainder = np.clip(context - base * pcp_size - ranks * interleave, 0, interleave)
    return (base + remainder)[:, :, None]


@dataclass(frozen=True)
class PcpStageMetadata:
    """Host values of one rank's ``AscendPrefillContextParallelMetadata`` for one stage."""

    pcp_rank: int
    num_actual_tokens_pcp_padded: int
    num_computed_tokens_of_pcp_dcp: np.ndarray
    pcp_unpad_mask: np.ndarray
    query_lens_pcp_full_cpu: np.ndarray
    max_query_len_pcp_full: int
    pcp_allgather_restore_idx: np.ndarray
    q_head_idx: np.ndarray
    q_tail_idx: np.ndarray
    q_full_idx: np.ndarray
    kv_idx: dict
    attn_chunk_seqlens: np.ndarray
    attn_mask_seqlens: list
    head_attn_nomask_seqlens: list
    tail_attn_nomask_seqlens: list
    head_actual_seq_lengths_kv: list
    tail_actual_seq_lengths_kv: list


KV_INDEX_NAMES = (
    "kv_with_q_head_nomask_idx_tensor",
    "kv_with_q_head_mask_idx_tensor",
    "kv_with_q_tail_nomask_idx_tensor",
    "kv_with_q_tail_mask_idx_tensor",
    "kv_tail_proj_idx_tensor",
    "kv_with_q_head_attn_idx_in_tail_tensor",
    "kv_with_q_tail_attn_idx_in_tail_tensor",
)


def stage_metadata(stage: PcpStageTokens, pcp_size: int, pcp_rank: int, *,
                   interleave: int = DEFAULT_CP_KV_CACHE_INTERLEAVE_SIZE,
                   layout: ZigzagLayout | None = None) -> PcpStageMetadata:
    """Rank ``pcp_rank``'s PCP metadata of ``stage`` scheduled alone (its own zigzag)."""
    return stage_metadata_of_ranks(stage, pcp_size, interleave=interleave,
                                   layout=layout)[pcp_rank]


def stage_metadata_of_ranks(stage: PcpStageTokens, pcp_size: int, *,
                            interleave: int = DEFAULT_CP_KV_CACHE_INTERLEAVE_SIZE,
                            layout: ZigzagLayout | None = None) -> tuple[PcpStageMetadata, ...]:
    """Every rank's PCP metadata of ``stage`` scheduled alone, computed for all ranks at once;
    each rank's arrays are its own (as each rank's PCP manager makes them).

    ``layout``: the stage's zigzag, where the caller already made it (it is every rank's).
    """
    if layout is None:
        layout = zigzag_layout(stage.num_scheduled_tokens, pcp_size)
    elif layout.pcp_size != pcp_size or not np.array_equal(layout.num_scheduled_tokens,
                                                           stage.num_scheduled_tokens):
        raise ValueError(f"layout of {layout.num_scheduled_tokens.tolist()} tokens over "
                         f"{layout.pcp_size} ranks given for a stage of "
                         f"{np.asarray(stage.num_scheduled_tokens).tolist()} over {pcp_size}")
    decodes = layout.num_decode_reqs
    scheduled = stage.num_scheduled_tokens
    computed = stage.num_computed_tokens
    context = np.concatenate([computed[:decodes] + scheduled[:decodes], computed[decodes:]])
    prefill_rank_tokens = layout.rank_tokens[decodes:]
    chunk = prefill_rank_tokens // ZIGZAG_CHUNKS_PER_RANK
    # The helper indexes the prefill rows from the first prefill request: its loop skips
    # the leading decodes without advancing the q / kv offsets.
    q_offset = np.cumsum(prefill_rank_tokens) - prefill_rank_tokens
    kv_offset = q_offset * pcp_size
    # [rank, request]: rank r's head chunk is r, its tail chunk 2 * pcp - 1 - r.
    head_id = np.arange(pcp_size, dtype=np.int64)[:, None]
    tail_id = ZIGZAG_CHUNKS_PER_RANK * pcp_size - 1 - head_id
    tail_proj = chunk * (tail_id + 1)
    tail_proj_offset = np.cumsum(tail_proj, axis=1) - tail_proj
    kv_idx = _kv_index_ranges({
        "kv_with_q_head_nomask_idx_tensor": (kv_offset, chunk * head_id),
        "kv_with_q_head_mask_idx_tensor": (kv_offset + chunk * head_id, chunk),
        "kv_with_q_tail_nomask_idx_tensor": (kv_offset, chunk * tail_id),
        "kv_with_q_tail_mask_idx_tensor": (kv_offset + chunk * tail_id, chunk),
        "kv_tail_proj_idx_tensor": (kv_offset, tail_proj),
        "kv_with_q_head_attn_idx_in_tail_tensor": (tail_proj_offset, chunk * (head_id + 1)),
        "kv_with_q_tail_attn_idx_in_tail_tensor": (tail_proj_offset, tail_proj),
    }, pcp_size, len(chunk))
    q_head = block_ranges(q_offset, chunk)
    q_tail = block_ranges(q_offset + chunk, chunk)
    q_full = np.argsort(np.concatenate([q_head, q_tail]), kind="stable")
    local_context = cp_local_context_lens(context, pcp_size, interleave)
    unpad_mask = layout.unpad_mask
    restore = layout.allgather_restore_idx[:int(layout.padded_tokens.sum())]
    head_nomask = np.cumsum(chunk * head_id, axis=1)
    tail_nomask = np.cumsum(chunk * tail_id, axis=1)
    head_kv = np.cumsum(chunk * (head_id + 1), axis=1)
    tail_kv = np.cumsum(tail_proj, axis=1)
    padded_rows = layout.rows_per_rank * pcp_size
    mask_seqlens = np.cumsum(chunk)
    return tuple(PcpStageMetadata(
        pcp_rank=rank,
        num_actual_tokens_pcp_padded=padded_rows,
        num_computed_tokens_of_pcp_dcp=local_context.copy(),
        pcp_unpad_mask=unpad_mask.copy(),
        query_lens_pcp_full_cpu=scheduled.copy(),
        max_query_len_pcp_full=int(scheduled.max()),
        pcp_allgather_restore_idx=restore.copy(),
        q_head_idx=q_head.copy(),
        q_tail_idx=q_tail.copy(),
        q_full_idx=q_full.copy(),
        kv_idx={name: per_rank[rank] for name, per_rank in kv_idx.items()},
        attn_chunk_seqlens=chunk.copy(),
        attn_mask_seqlens=mask_seqlens.tolist(),
        head_attn_nomask_seqlens=head_nomask[rank].tolist(),
        tail_attn_nomask_seqlens=tail_nomask[rank].tolist(),
        head_actual_seq_lengths_kv=head_kv[rank].tolist(),
        tail_actual_seq_lengths_kv=tail_kv[rank].tolist(),
    ) for rank in range(pcp_size))


def _kv_index_ranges(specs: dict, pcp_size: int, num_requests: int) -> dict:
    """``{name: _rank_block_ranges(starts, lengths)}`` of every ``(starts, lengths)`` pair, each
    broadcasting to ``[pcp_size, num_requests]``: all of them in one ``block_ranges`` pass, then
    cut per name and rank (every rank's array its own). The CPU emulation builds them for
    every stage of every PCP step, so their host cost is the gates' loop (issue 43)."""
    zero = np.zeros((pcp_size, num_requests), dtype=np.int64)  # broadcasts each to [rank, request]
    starts = np.concatenate([np.asarray(starts, dtype=np.int64) + zero
                             for starts, _ in specs.values()])
    lengths = np.concatenate([np.asarray(lengths, dtype=np.int64) + zero
                              for _, lengths in specs.values()])
    pieces = _rank_block_ranges(starts, lengths)  # every name's ranks, stacked: one pass
    return {name: pieces[index * pcp_size:(index + 1) * pcp_size]
            for index, name in enumerate(specs)}


def _rank_block_ranges(starts, lengths) -> list[np.ndarray]:
    """Per rank (row of the broadcast ``[rank, request]`` arrays): its ``block_ranges``,
    each rank's array its own.

    All ranks in one pass (``block_ranges`` of the flattened rows, then cut per rank):
    ``start + offset`` of each block's entries is ``arange(total) + (start - first index
    of the block)``, one ``repeat`` instead of two; the CPU emulation builds these for
    every stage of every PCP step, so its host cost is the gates' loop (issue 43).
    """
    starts = np.atleast_2d(np.asarray(starts, dtype=np.int64))
    lengths = np.atleast_2d(np.asarray(lengths, dtype=np.int64))
    shape = np.broadcast_shapes(starts.shape, lengths.shape)
    starts = np.broadcast_to(starts, shape).reshape(-1)
    lengths = np.broadcast_to(lengths, shape).reshape(-1)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    flat = np.arange(total, dtype=np.int64) + np.repeat(starts - (ends - lengths), lengths)
    bounds = ends.reshape(shape)[:, -1].tolist() if shape[1] else [0] * shape[0]
    return [flat[start:stop].copy() for start, stop in itertools.pairwise([0, *bounds])]
