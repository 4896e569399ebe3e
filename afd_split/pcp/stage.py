"""Stage-local prefill-context-parallel (PCP) layout and metadata of a split (numpy only).

Under PCP every request of a prefill batch is padded to a multiple of
2 * pcp tokens and cut into 2 * pcp equal chunks; rank r holds chunk r and
chunk 2 * pcp - 1 - r ("DualChunkSwap", vLLM-Ascend's ``PCPManager``). A split
stage is laid out as its own batch: each request piece of the stage gets its
own zigzag, the head of a cut request as if scheduled alone and the tail as a
continuation whose computed tokens are advanced by the head's share. Every
stage's metadata is therefore what vLLM-Ascend's PCP helper builds for that
stage's tokens scheduled on their own; ``afd_split.pcp.stage_metadata`` writes it
out (tests hold it against an independent reference of the helper's maths at
vllm-ascend v0.19.1rc1 ``vllm_ascend/worker/pcp_utils.py``).

Inputs are the GLOBAL scheduled counts (identical on every PCP rank); under
PCP the runner overwrites ``num_scheduled_tokens_np`` with its rank-local
counts, which must never be planned on.

Only the non-hybrid, non-speculative path with DCP 1 is modelled (what the
recipe runs); ``check_pcp_stage_support`` refuses the rest by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from afd_split.errors import UnsupportedSplitError
from afd_split.plan.constraints import MIN_PCP_FOR_ZIGZAG, ZIGZAG_CHUNKS_PER_RANK
from afd_split.plan.types import SplitPlan

DECODE_THRESHOLD = 1
"""Tokens at or below which a leading request counts as a decode (``PCPManager.decode_threshold``
without speculative decoding): decodes are not split but duplicated on every PCP rank."""

PAD_TOKEN = -1
"""Row source of a padding row in the layouts below."""


def check_pcp_stage_support(*, pcp_size: int, dcp_size: int, num_speculative_tokens: int,
                            hybrid_attention: bool) -> None:
    """Fail closed, naming the setting, where the stage-local PCP layout is not modelled."""
    if pcp_size < MIN_PCP_FOR_ZIGZAG:
        return
    reasons = []
    if dcp_size != 1:
        reasons.append(f"decode_context_parallel_size={dcp_size} (only 1 is modelled with PCP)")
    if num_speculative_tokens:
        reasons.append(f"num_speculative_tokens={num_speculative_tokens} (PCP stages model no "
                       "speculative decoding)")
    if hybrid_attention:
        reasons.append("hybrid attention (pcp_use_hybrid_attn, qwen3_next) under PCP")
    if reasons:
        raise UnsupportedSplitError(
            f"prefill_context_parallel_size={pcp_size} stage split: " + "; ".join(reasons))


@dataclass(frozen=True)
class PcpStageTokens:
    """One stage's requests as the PCP helper must see them (global counts, stage-local).

    ``num_computed_tokens`` of a tail piece that starts inside a request already
    includes the head's share; ``token_start`` is the stage's first token in the
    parent's logical (unpermuted) token order.
    """

    index: int
    request_start: int
    token_start: int
    num_scheduled_tokens: np.ndarray
    num_computed_tokens: np.ndarray

    @property
    def num_tokens(self) -> int:
        return int(self.num_scheduled_tokens.sum())


def stage_tokens(plan: SplitPlan, num_computed_tokens) -> tuple[PcpStageTokens, ...]:
    """Each ubatch's request pieces and their computed tokens (a tail advanced by its head)."""
    counts = np.asarray(plan.token_counts, dtype=np.int64)
    computed = np.asarray(num_computed_tokens, dtype=np.int64)
    if computed.shape != counts.shape:
        raise ValueError(f"num_computed_tokens has shape {computed.shape}; the plan has "
                         f"{len(counts)} requests")
    request_starts = np.cumsum(counts) - counts
    stages = []
    for ubatch in plan.ubatches:
        requests = slice(ubatch.request_slice.start, ubatch.request_slice.stop)
        starts = request_starts[requests]
        stops = starts + counts[requests]
        piece_starts = np.maximum(starts, ubatch.token_slice.start)
        piece_stops = np.minimum(stops, ubatch.token_slice.stop)
        stages.append(PcpStageTokens(
            index=ubatch.index,
            request_start=requests.start,
            token_start=ubatch.token_slice.start,
            num_scheduled_tokens=piece_stops - piece_starts,
            num_computed_tokens=computed[requests] + (piece_starts - starts),
        ))
    return tuple(stages)


def num_decode_requests(num_scheduled_tokens: np.ndarray) -> int:
    """Leading requests of at most ``DECODE_THRESHOLD`` tokens (the helper's first prefill)."""
    is_prefill = num_scheduled_tokens > DECODE_THRESHOLD
    return int(is_prefill.argmax()) if is_prefill.any() else len(num_scheduled_tokens)


def rank_rows_per_request(num_scheduled_tokens, pcp_size: int,
                          num_decode_reqs: int | None = None) -> np.ndarray:
    """Rows every PCP rank holds of each request: its tokens padded to 2 * pcp, over pcp;
    a leading decode's own tokens (copied onto every rank)."""
    counts = np.asarray(num_scheduled_tokens, dtype=np.int64)
    decodes = num_decode_requests(counts) if num_decode_reqs is None else num_decode_reqs
    chunks = ZIGZAG_CHUNKS_PER_RANK * pcp_size
    rows = -(-counts // chunks) * ZIGZAG_CHUNKS_PER_RANK
    rows[:decodes] = counts[:decodes]
    return rows


def _segment_arange(lengths: np.ndarray) -> np.ndarray:
    """[2, 3] -> [0, 1, 0, 1, 2]."""
    total = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    return np.arange(total, dtype=np.int64) - starts


@dataclass(frozen=True)
class ZigzagLayout:
    """One batch's DualChunkSwap layout over ``pcp_size`` ranks (all ranks at once).

    ``rank_sources[r]`` is, for every row rank r holds, the token it carries as
    an offset into the batch's logical order (``PAD_TOKEN`` for padding);
    ``padded_offsets[r]`` the same row's place in the padded all-gather layout
    (request after request, each padded to ``padded_tokens``).
    """

    pcp_size: int
    num_scheduled_tokens: np.ndarray
    num_decode_reqs: int
    padded_tokens: np.ndarray
    rank_tokens: np.ndarray
    chunk_sizes: np.ndarray
    padded_offsets: np.ndarray
    rank_sources: np.ndarray

    @property
    def num_pads(self) -> np.ndarray:
        return self.padded_tokens - self.num_scheduled_tokens

    @property
    def rows_per_rank(self) -> int:
        return int(self.rank_tokens.sum())

    @property
    def unpad_mask(self) -> np.ndarray:
        """True at every real token of the padded all-gather layout."""
        return _segment_arange(self.padded_tokens) < np.repeat(self.num_scheduled_tokens,
                                                                self.padded_tokens)

    @property
    def allgather_restore_idx(self) -> np.ndarray:
        """Index that puts the ranks' concatenated rows back in padded request order."""
        return np.argsort(self.padded_offsets.reshape(-1), kind="stable")


def zigzag_layout(num_scheduled_tokens, pcp_size: int, *,
                  num_decode_reqs: int | None = None) -> ZigzagLayout:
    """The DualChunkSwap layout of one batch (leading 1-token requests duplicated as decodes).

    ``num_decode_reqs`` overrides the leading-decode count: a sub-list of a batch's
    requests keeps the decode status the whole batch gave them (``pcp_relayout``).
    """
    counts = np.asarray(num_scheduled_tokens, dtype=np.int64)
    chunks = ZIGZAG_CHUNKS_PER_RANK * pcp_size
    num_decodes = num_decode_requests(counts) if num_decode_reqs is None else num_decode_reqs
    padded = -(-counts // chunks) * chunks
    padded[:num_decodes] = counts[:num_decodes] * pcp_size
    rank_tokens = padded // pcp_size
    chunk_sizes = np.maximum(rank_tokens // ZIGZAG_CHUNKS_PER_RANK, 1)
    chunk_sizes[:num_decodes] = rank_tokens[:num_decodes]
    within = _segment_arange(rank_tokens)
    per_row_chunk = np.repeat(chunk_sizes, rank_tokens)
    is_head = within < per_row_chunk
    in_chunk = np.where(is_head, within, within - per_row_chunk)
    # Every rank at once ([pcp, rows]): a row's chunk is its rank's head or mirrored tail.
    ranks = np.arange(pcp_size, dtype=np.int64)[:, None]
    chunk = np.where(is_head, ranks, chunks - 1 - ranks)
    position = chunk * per_row_chunk + in_chunk  # offset inside the padded request
    offsets = np.repeat(np.cumsum(padded) - padded, rank_tokens) + position
    # A decode's token sits once per rank in the padded layout; every rank carries it.
    decode_rows = int(rank_tokens[:num_decodes].sum())
    position[:, :decode_rows] = within[:decode_rows]
    logical_start = np.repeat(np.cumsum(counts) - counts, rank_tokens)
    sources = np.where(position < np.repeat(counts, rank_tokens), logical_start + position,
                       PAD_TOKEN)
    return ZigzagLayout(pcp_size, counts, num_decodes, padded, rank_tokens, chunk_sizes,
                        offsets, sources)


def rank_positions(rank_rows, num_computed_tokens, decode, pcp_size: int,
                   pcp_rank: int) -> np.ndarray:
    """Positions of rank ``pcp_rank``'s rows of a batch laid out request after request with
    ``rank_rows`` rows each: the engine's PCP rule (``update_tokens_for_pcp``), computed
    tokens plus the row's offset in its padded request (head chunk ``rank``, tail chunk
    ``2 * pcp - 1 - rank``); a decode (``decode`` mask) its own token index."""
    rows = np.asarray(rank_rows, dtype=np.int64)
    owner = np.repeat(np.arange(len(rows)), rows)
    within = _segment_arange(rows)
    chunk = (rows // ZIGZAG_CHUNKS_PER_RANK)[owner]
    offset = np.where(within < chunk, pcp_rank * chunk + within,
                      (ZIGZAG_CHUNKS_PER_RANK * pcp_size - 1 - pcp_rank) * chunk + within - chunk)
    offset = np.where(np.asarray(decode)[owner], within, offset)
    return np.asarray(num_computed_tokens, dtype=np.int64)[owner] + offset


def block_ranges(starts, lengths) -> np.ndarray:
    """``[start, start + length)`` of every block, concatenated."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.repeat(starts, lengths) + _segment_arange(lengths)


def padded_slot_mapping(layout: ZigzagLayout, slot_mapping) -> np.ndarray:
    """The stage's slots in the padded all-gather layout (-1 on padding), as the helper's
    ``get_padded_slot_mapping`` lays out the real tokens' slots."""
    slots = np.asarray(slot_mapping)
    if len(slots) != int(layout.num_scheduled_tokens.sum()):
        raise ValueError(f"slot_mapping has {len(slots)} entries; the stage has "
                         f"{int(layout.num_scheduled_tokens.sum())} tokens")
    padded = np.full(int(layout.padded_tokens.sum()), -1, dtype=slots.dtype)
    padded[layout.unpad_mask] = slots
    return padded


@dataclass(frozen=True)
class StageRows:
    """The parent's per-rank rows laid out stage after stage, each stage its own zigzag.

    ``rank_sources[r]``: logical token of each row rank r holds (``PAD_TOKEN`` on
    padding); stage ``s`` owns rows ``rank_row_slices[s]`` on every rank, so the
    plugin's per-stage row slice is contiguous and matches the stage's metadata.
    ``moved_tokens`` counts the real tokens whose rank differs from the unsplit
    batch's whole-request zigzag (the re-permutation's cost); ``extra_pad_rows``
    the padding the per-piece zigzag adds over the whole-request one.
    """

    stages: tuple[ZigzagLayout, ...]
    rank_sources: np.ndarray
    rank_row_slices: tuple[slice, ...]
    moved_tokens: int
    extra_pad_rows: int


def token_ranks(layout: ZigzagLayout) -> np.ndarray:
    """The rank holding each real token of ``layout`` (decodes: rank 0, where the helper keeps
    the real copy in its unpad mask)."""
    owner = np.full(int(layout.num_scheduled_tokens.sum()), -1, dtype=np.int64)
    for rank in range(layout.pcp_size - 1, -1, -1):
        rows = layout.rank_sources[rank]
        owner[rows[rows != PAD_TOKEN]] = rank
    return owner


def stage_rows(plan: SplitPlan, num_computed_tokens, pcp_size: int) -> StageRows:
    """Per-stage zigzag rows of ``plan`` on ``pcp_size`` ranks, and their cost."""
    stages = stage_tokens(plan, num_computed_tokens)
    layouts = tuple(zigzag_layout(stage.num_scheduled_tokens, pcp_size) for stage in stages)
    sources, slices, cursor = [], [], 0
    for stage, layout in zip(stages, layouts, strict=True):
        shifted = np.where(layout.rank_sources == PAD_TOKEN, PAD_TOKEN,
                           layout.rank_sources + stage.token_start)
        sources.append(shifted)
        slices.append(slice(cursor, cursor + layout.rows_per_rank))
        cursor += layout.rows_per_rank
    rank_sources = np.concatenate(sources, axis=1)
    whole = zigzag_layout(np.asarray(plan.token_counts, dtype=np.int64), pcp_size)
    split_owner = np.concatenate([token_ranks(layout) for layout in layouts])
    return StageRows(
        stages=layouts,
        rank_sources=rank_sources,
        rank_row_slices=tuple(slices),
        moved_tokens=int((split_owner != token_ranks(whole)).sum()),
        extra_pad_rows=int(sum(int(layout.num_pads.sum()) for layout in layouts)
                           - int(whole.num_pads.sum())),
    )
