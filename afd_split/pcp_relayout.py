"""Moving one PCP rank's rows between the parent's layout and the split's stage layouts.

The engine lays a prefill batch out once, before any planner runs: one
DualChunkSwap zigzag per whole request (``pcp_stage.zigzag_layout``), and the
dense layers run the whole batch on those rows. A split stage must run on its
own zigzag (each request piece laid out as if scheduled alone, ``pcp_stage``),
because its PCP attention metadata describes that layout. For a cut request
the two layouts put different tokens on a rank, so the rows have to move
between ranks: after the dense layers into the stage layout, and after the
last stage back to the parent's layout (where the engine's own PCP restore and
logits selection expect them).

``rank_relayout`` computes, for one rank, index maps for both moves. Only the
requests whose rows differ between the layouts are exchanged, by one
all-gather over the PCP group each way (every rank contributes the same rows
of the same requests, so the gather is rectangular). Everything is host
integer arithmetic on the GLOBAL scheduled counts, identical on every rank;
``relay_rows`` / ``restore_rows`` apply the maps to tensors with the caller's
all-gather (vLLM's ``get_pcp_group().all_gather`` on the engine, an emulation
on the CPU backend, which runs every PCP split through these functions).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from afd_split.constraints import ZIGZAG_CHUNKS_PER_RANK, round_up
from afd_split.pcp_stage import (
    PAD_TOKEN,
    num_decode_requests,
    stage_tokens,
    zigzag_layout,
)
from afd_split.plan_types import SplitPlan

NO_SOURCE = -1
"""Map entry of a padding row: filled with zeros, never read from a source row."""

AllGather = Callable[[object], object]
"""``rows [n, ...] -> [pcp * n, ...]``: every rank's rows concatenated in PCP rank order."""


@dataclass(frozen=True)
class RankRelayout:
    """One PCP rank's index maps between the parent layout and the stages' layouts.

    Inbound (after the dense layers): this rank sends its parent rows
    ``send_parent_rows`` to the all-gather; stage row ``i`` is row
    ``stage_sources[i]`` of ``[parent rows ; gathered rows]`` (``NO_SOURCE``: padding).
    Outbound (after the last stage): it sends its stage rows ``send_stage_rows``;
    parent row ``i`` is row ``parent_sources[i]`` of ``[stage rows ; gathered rows]``.
    ``stage_positions`` are the stage rows' positions (the engine's rule: computed
    tokens plus the row's offset in its padded piece).
    """

    pcp_size: int
    pcp_rank: int
    parent_rows: int
    stage_row_counts: tuple[int, ...]
    send_parent_rows: np.ndarray
    stage_sources: np.ndarray
    stage_positions: np.ndarray
    send_stage_rows: np.ndarray
    parent_sources: np.ndarray
    exchanged_requests: np.ndarray

    @property
    def stage_rows(self) -> int:
        return int(sum(self.stage_row_counts))

    @property
    def stage_row_slices(self) -> tuple[slice, ...]:
        """Each stage's rows in the relaid concatenation (the plugin's token slices)."""
        starts = np.concatenate([[0], np.cumsum(self.stage_row_counts)])
        return tuple(slice(int(a), int(b)) for a, b in itertools.pairwise(starts))


def _row_of_token(sources: np.ndarray, num_tokens: int) -> np.ndarray:
    """Per token: the row holding it in ``sources`` (one rank's rows), or ``NO_SOURCE``."""
    rows = np.full(num_tokens, NO_SOURCE, dtype=np.int64)
    real = sources != PAD_TOKEN
    rows[sources[real]] = np.flatnonzero(real)
    return rows


def _rank_rows(counts: np.ndarray, num_decodes: int, pcp: int) -> np.ndarray:
    """Rows every rank holds per request (or piece): padded / pcp, a decode's own tokens."""
    rows = np.array([round_up(int(n), ZIGZAG_CHUNKS_PER_RANK * pcp) // pcp for n in counts],
                    dtype=np.int64)
    rows[:num_decodes] = counts[:num_decodes]
    return rows


def _block_rows(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """[start, start + length) of every block, concatenated."""
    total = int(lengths.sum())
    return np.repeat(starts - (np.cumsum(lengths) - lengths), lengths) + np.arange(total)


@dataclass(frozen=True)
class _Pieces:
    """The stages' request pieces, flattened stage after stage."""

    request: np.ndarray
    tokens: np.ndarray
    token_offset: np.ndarray  # first token inside its request
    computed: np.ndarray
    decode: np.ndarray
    stage: np.ndarray


def _pieces(plan: SplitPlan, computed: np.ndarray) -> _Pieces:
    parts = []
    for stage in stage_tokens(plan, computed):
        count = len(stage.num_scheduled_tokens)
        requests = stage.request_start + np.arange(count)
        decode = np.arange(count) < num_decode_requests(stage.num_scheduled_tokens)
        parts.append((requests, stage.num_scheduled_tokens,
                      stage.num_computed_tokens - computed[requests], stage.num_computed_tokens,
                      decode, np.full(count, stage.index)))
    return _Pieces(*(np.concatenate(column) for column in zip(*parts, strict=True)))


def _sub_sources(counts: np.ndarray, num_decodes: int, pcp: int,
                 token_starts: np.ndarray) -> np.ndarray:
    """[pcp, rows] tokens of a sub-list's zigzag rows, placed at ``token_starts`` per item."""
    layout = zigzag_layout(counts, pcp, num_decode_reqs=num_decodes)
    local_starts = np.cumsum(counts) - counts
    owner = np.repeat(np.arange(len(counts)), layout.rank_tokens)
    shift = (token_starts - local_starts)[owner]
    return np.where(layout.rank_sources == PAD_TOKEN, PAD_TOKEN, layout.rank_sources + shift)


def _gathered_sources(want: np.ndarray, have: np.ndarray, num_tokens: int,
                      num_local_rows: int) -> np.ndarray:
    """Rows of ``[local rows ; all-gather of every rank's ``have`` rows]`` that hold each
    token of ``want`` (one rank's rows; ``NO_SOURCE`` on padding).

    ``have`` is the [pcp, rows] tokens of the differing items in the source layout;
    every rank sends all of them, so each wanted token is in the gathered rows.
    """
    gathered = _row_of_token(have.reshape(-1), num_tokens)
    real = want != PAD_TOKEN
    sources = np.full(len(want), NO_SOURCE, dtype=np.int64)
    sources[real] = num_local_rows + gathered[want[real]]
    return sources


def _stage_positions(pieces: _Pieces, rows: np.ndarray, pcp: int, rank: int) -> np.ndarray:
    """Positions of one rank's stage rows (the engine's rule: computed tokens plus the
    row's offset in its padded piece; a decode's own token index)."""
    owner = np.repeat(np.arange(len(rows)), rows)
    within = np.arange(int(rows.sum())) - np.repeat(np.cumsum(rows) - rows, rows)
    chunk = (rows // ZIGZAG_CHUNKS_PER_RANK)[owner]
    is_head = within < chunk
    offset = np.where(is_head, rank * chunk + within,
                      (ZIGZAG_CHUNKS_PER_RANK * pcp - 1 - rank) * chunk + within - chunk)
    offset = np.where(pieces.decode[owner], within, offset)
    return pieces.computed[owner] + offset


def rank_relayout(plan: SplitPlan, num_computed_tokens, pcp_rank: int) -> RankRelayout:
    """Rank ``pcp_rank``'s maps between the parent's whole-request zigzag and ``plan``'s
    per-stage zigzags (``plan.constraints.pcp_size`` ranks, global counts).

    Requests whose rows are the same in both layouts (whole in one stage, same decode
    status) are block copies; only the others (the cut request's pieces, a request
    that a one-token tail turns into a decode) are mapped token by token.
    """
    pcp = plan.constraints.pcp_size
    if not 0 <= pcp_rank < pcp:
        raise ValueError(f"pcp_rank={pcp_rank} is outside the {pcp} PCP ranks of the plan")
    counts = np.asarray(plan.token_counts, dtype=np.int64)
    computed = np.asarray(num_computed_tokens, dtype=np.int64)
    num_decodes = num_decode_requests(counts)
    parent_rows = _rank_rows(counts, num_decodes, pcp)
    parent_starts = np.cumsum(parent_rows) - parent_rows
    pieces = _pieces(plan, computed)
    stage_rows = np.concatenate([
        _rank_rows(pieces.tokens[pieces.stage == s], int(pieces.decode[pieces.stage == s].sum()),
                   pcp) for s in range(len(plan.ubatches))])
    stage_starts = np.cumsum(stage_rows) - stage_rows
    same = (pieces.tokens == counts[pieces.request]) & (
        pieces.decode == (pieces.request < num_decodes))

    # Block copies, both ways.
    stage_sources = np.full(int(stage_rows.sum()), NO_SOURCE, dtype=np.int64)
    parent_sources = np.full(int(parent_rows.sum()), NO_SOURCE, dtype=np.int64)
    same_stage = _block_rows(stage_starts[same], stage_rows[same])
    same_parent = _block_rows(parent_starts[pieces.request[same]], stage_rows[same])
    stage_sources[same_stage] = same_parent
    parent_sources[same_parent] = same_stage

    # Token-level maps of the differing requests, in their own token space.
    differ = np.unique(pieces.request[~same])
    sub_counts = counts[differ]
    sub_starts = np.cumsum(sub_counts) - sub_counts
    sub_tokens = int(sub_counts.sum())
    parent_have = _sub_sources(sub_counts, int((differ < num_decodes).sum()), pcp, sub_starts)
    parent_full_rows = _block_rows(parent_starts[differ], parent_rows[differ])
    piece_index = np.flatnonzero(~same)
    piece_sub_start = sub_starts[np.searchsorted(differ, pieces.request[piece_index])] + (
        pieces.token_offset[piece_index])
    stage_have = np.concatenate([
        _sub_sources(pieces.tokens[chosen], int(pieces.decode[chosen].sum()), pcp,
                     piece_sub_start[np.isin(piece_index, chosen)])
        for chosen in (piece_index[pieces.stage[piece_index] == s]
                       for s in range(len(plan.ubatches)))], axis=1)
    stage_full_rows = _block_rows(stage_starts[piece_index], stage_rows[piece_index])
    stage_sources[stage_full_rows] = _gathered_sources(stage_have[pcp_rank], parent_have,
                                                       sub_tokens, len(parent_sources))
    parent_sources[parent_full_rows] = _gathered_sources(parent_have[pcp_rank], stage_have,
                                                         sub_tokens, len(stage_sources))
    return RankRelayout(
        pcp_size=pcp, pcp_rank=pcp_rank, parent_rows=len(parent_sources),
        stage_row_counts=tuple(int(stage_rows[pieces.stage == s].sum())
                               for s in range(len(plan.ubatches))),
        send_parent_rows=parent_full_rows, stage_sources=stage_sources,
        stage_positions=_stage_positions(pieces, stage_rows, pcp, pcp_rank),
        send_stage_rows=stage_full_rows, parent_sources=parent_sources,
        exchanged_requests=differ,
    )


def _pool(rows, gathered, sources: np.ndarray):
    """``[rows ; gathered]`` indexed by ``sources`` (zeros at ``NO_SOURCE``)."""
    if isinstance(rows, np.ndarray):
        pool = np.concatenate([rows, gathered, np.zeros_like(rows[:1])])
        return pool[np.where(sources == NO_SOURCE, len(pool) - 1, sources)]
    import torch  # lazy: numpy callers never pay for it

    pool = torch.cat([rows, gathered, rows.new_zeros((1, *rows.shape[1:]))])
    take = torch.from_numpy(np.where(sources == NO_SOURCE, len(pool) - 1, sources))
    return pool.index_select(0, take.to(rows.device))


def _rows(rows, index: np.ndarray):
    if isinstance(rows, np.ndarray):
        return rows[index]
    import torch

    return rows.index_select(0, torch.from_numpy(index).to(rows.device))


def _check_rows(rows, expected: int, what: str, rank: int) -> None:
    if len(rows) != expected:
        raise ValueError(f"{len(rows)} {what} rows on PCP rank {rank}; the layout has {expected}")


def inbound_send(relayout: RankRelayout, parent_rows):
    """What this rank contributes to the inbound all-gather: its rows of the exchanged requests."""
    _check_rows(parent_rows, relayout.parent_rows, "parent", relayout.pcp_rank)
    return _rows(parent_rows, relayout.send_parent_rows)


def inbound_assemble(relayout: RankRelayout, parent_rows, gathered):
    """This rank's stage rows (all stages, concatenated) from its parent rows and the gather."""
    return _pool(parent_rows, gathered, relayout.stage_sources)


def outbound_send(relayout: RankRelayout, stage_rows_concat):
    """What this rank contributes to the outbound all-gather: its rows of the exchanged pieces."""
    _check_rows(stage_rows_concat, relayout.stage_rows, "stage", relayout.pcp_rank)
    return _rows(stage_rows_concat, relayout.send_stage_rows)


def outbound_assemble(relayout: RankRelayout, stage_rows_concat, gathered):
    """This rank's parent rows from its stage rows and the gather."""
    return _pool(stage_rows_concat, gathered, relayout.parent_sources)


def relay_rows(relayout: RankRelayout, parent_rows, all_gather: AllGather):
    """This rank's stage rows (all stages, concatenated) from its parent rows [R, ...]."""
    return inbound_assemble(relayout, parent_rows,
                            all_gather(inbound_send(relayout, parent_rows)))


def restore_rows(relayout: RankRelayout, stage_rows_concat, all_gather: AllGather):
    """This rank's parent rows back from its stage rows (all stages, concatenated)."""
    return outbound_assemble(relayout, stage_rows_concat,
                             all_gather(outbound_send(relayout, stage_rows_concat)))


def _concat(parts: Sequence):
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    import torch

    return torch.cat(list(parts))


def relay_all_ranks(relayouts: Sequence[RankRelayout], per_rank_parent_rows: Sequence) -> list:
    """``relay_rows`` of every rank held in one process (the CPU emulation): each rank's
    contribution, their concatenation in rank order as the all-gather, each rank's rows."""
    gathered = _concat([inbound_send(relayout, rows) for relayout, rows
                        in zip(relayouts, per_rank_parent_rows, strict=True)])
    return [inbound_assemble(relayout, rows, gathered)
            for relayout, rows in zip(relayouts, per_rank_parent_rows, strict=True)]


def restore_all_ranks(relayouts: Sequence[RankRelayout], per_rank_stage_rows: Sequence) -> list:
    """``restore_rows`` of every rank held in one process (the CPU emulation)."""
    gathered = _concat([outbound_send(relayout, rows) for relayout, rows
                        in zip(relayouts, per_rank_stage_rows, strict=True)])
    return [outbound_assemble(relayout, rows, gathered)
            for relayout, rows in zip(relayouts, per_rank_stage_rows, strict=True)]
