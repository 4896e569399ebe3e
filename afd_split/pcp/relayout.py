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

``rank_relayout`` computes, for one rank, index maps for both moves. Requests
laid out alike in both (whole in one stage, same decode status) stay where they
are; of the others (the cut request, a request a one-token tail turns into a
decode) each rank receives exactly the rows it lacks, from the rank that holds
each, by one all-to-all over the PCP group each way (unequal splits, as
``torch.distributed.all_to_all_single`` takes them; vLLM-Ascend's MoE uses the
same call). Everything is host integer arithmetic on the GLOBAL scheduled
counts, identical on every rank, so every rank knows every rank's sends;
``relay_rows`` / ``restore_rows`` apply the maps with the caller's all-to-all
(the PCP group's on the engine, an emulation on the CPU backend, which runs
every PCP split through these functions).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from afd_split.pcp.stage import (
    PAD_TOKEN,
    block_ranges,
    num_decode_requests,
    rank_positions,
    rank_rows_per_request,
    stage_tokens,
    zigzag_layout,
)
from afd_split.plan.types import SplitPlan

NO_SOURCE = -1
"""Map entry of a padding row: filled with zeros, never read from a source row."""

AllToAll = Callable[[object, Sequence[int], Sequence[int]], object]
"""``(rows, send_counts, recv_counts) -> received``: rank r's rows are sent in blocks of
``send_counts[q]`` to rank q, in rank order; the received rows are every rank's block for
this rank, in rank order (``recv_counts``), as ``all_to_all_single`` with split sizes."""


@dataclass(frozen=True)
class Exchange:
    """One all-to-all of one rank: the rows it sends (rank 0's block first) and its counts."""

    send_rows: np.ndarray
    send_counts: tuple[int, ...]
    recv_counts: tuple[int, ...]

    @property
    def received_rows(self) -> int:
        return int(sum(self.recv_counts))


@dataclass(frozen=True)
class RankRelayout:
    """One PCP rank's index maps between the parent layout and the stages' layouts.

    Inbound (after the dense layers): the rank sends ``inbound`` of its parent rows;
    stage row ``i`` is row ``stage_sources[i]`` of ``[parent rows ; received rows]``
    (``NO_SOURCE``: padding). Outbound (after the last stage): it sends ``outbound``
    of its stage rows; parent row ``i`` is row ``parent_sources[i]`` of
    ``[stage rows ; received rows]``. ``stage_positions`` are the stage rows'
    positions (the engine's rule: computed tokens plus the row's offset in its
    padded piece).
    """

    pcp_size: int
    pcp_rank: int
    parent_rows: int
    stage_row_counts: tuple[int, ...]
    inbound: Exchange
    stage_sources: np.ndarray
    stage_positions: np.ndarray
    outbound: Exchange
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
    """Per token: the first row holding it in ``sources``, or ``NO_SOURCE`` (a decode held on
    every rank: rank 0's copy, the one the engine's unpad mask keeps)."""
    rows = np.full(num_tokens, NO_SOURCE, dtype=np.int64)
    held = np.flatnonzero(sources != PAD_TOKEN)[::-1]
    rows[sources[held]] = held
    return rows


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


@dataclass(frozen=True)
class _Direction:
    """One move (into the stages, or back) on every rank at once: which row of ``want``
    (every rank's [pcp, rows] tokens of the differing items in the target layout) is held
    locally, and which comes from which rank's which ``have`` row (the source layout)."""

    real: np.ndarray
    tokens: np.ndarray
    from_rank: np.ndarray
    remote: np.ndarray
    owner_row: np.ndarray  # per token: its row in the first rank that holds it
    have_full_rows: np.ndarray  # a have row's full row on its rank

    def source_rows(self, tokens: np.ndarray) -> np.ndarray:
        """The full row of the rank that holds each of ``tokens``."""
        return self.have_full_rows[self.owner_row[tokens]]


def _direction(want: np.ndarray, have: np.ndarray, have_full_rows: np.ndarray,
               num_tokens: int) -> _Direction:
    """A wanted token a rank does not hold comes from the first rank that does (rank 0's
    copy of a decode, which every rank holds on the same row: decodes lead every rank's
    rows)."""
    pcp, width = have.shape
    flat = have.reshape(-1)
    first = _row_of_token(flat, num_tokens)
    owner, owner_row = first // width, first % width
    shared = np.bincount(flat[flat != PAD_TOKEN], minlength=num_tokens) > 1
    real = want != PAD_TOKEN
    tokens = np.where(real, want, 0)
    from_rank = owner[tokens]
    remote = real & (from_rank != np.arange(pcp)[:, None]) & ~shared[tokens]
    return _Direction(real, tokens, from_rank, remote, owner_row, have_full_rows)


def _exchange(direction: _Direction, rank: int,
              num_local_rows: int) -> tuple[Exchange, np.ndarray]:
    """(``rank``'s all-to-all, and its wanted rows' sources in ``[local rows ; received]``):
    every receiver takes its blocks in source rank order, each block in the receiver's own
    row order."""
    pcp, width = direction.real.shape
    # Sent by ``rank``: receiver after receiver, each in the receiver's row order.
    sent = np.flatnonzero((direction.remote & (direction.from_rank == rank)).reshape(-1))
    send_counts = np.bincount(sent // width, minlength=pcp)
    send_rows = direction.source_rows(direction.tokens.reshape(-1)[sent])
    # Received by ``rank``: sender after sender, each in this rank's row order.
    mine_remote, mine_from = direction.remote[rank], direction.from_rank[rank]
    incoming = np.flatnonzero(mine_remote)
    order = incoming[np.argsort(mine_from[incoming], kind="stable")]
    sources = np.full(width, NO_SOURCE, dtype=np.int64)
    held = direction.real[rank] & ~mine_remote
    sources[held] = direction.source_rows(direction.tokens[rank][held])
    sources[order] = num_local_rows + np.arange(len(order))
    recv_counts = np.bincount(mine_from[incoming], minlength=pcp)
    exchange = Exchange(send_rows.astype(np.int64), tuple(int(n) for n in send_counts),
                        tuple(int(n) for n in recv_counts))
    return exchange, sources


@dataclass(frozen=True)
class _Layouts:
    """What every rank's maps share: both layouts' rows, the block copies, and the
    differing items' rows on every rank (``*_have``: [pcp, rows] tokens)."""

    pcp: int
    pieces: _Pieces
    stage_rows: np.ndarray
    stage_row_counts: tuple[int, ...]
    block_stage_sources: np.ndarray
    block_parent_sources: np.ndarray
    differ: np.ndarray
    parent_full_rows: np.ndarray
    stage_full_rows: np.ndarray
    inbound: _Direction
    outbound: _Direction


def _layouts(plan: SplitPlan, num_computed_tokens) -> _Layouts:
    pcp = plan.constraints.pcp_size
    counts = np.asarray(plan.token_counts, dtype=np.int64)
    computed = np.asarray(num_computed_tokens, dtype=np.int64)
    num_decodes = num_decode_requests(counts)
    parent_rows = rank_rows_per_request(counts, pcp, num_decodes)
    parent_starts = np.cumsum(parent_rows) - parent_rows
    pieces = _pieces(plan, computed)
    stages = range(len(plan.ubatches))
    stage_rows = np.concatenate([
        rank_rows_per_request(pieces.tokens[pieces.stage == s], pcp,
                              int(pieces.decode[pieces.stage == s].sum())) for s in stages])
    stage_starts = np.cumsum(stage_rows) - stage_rows
    same = (pieces.tokens == counts[pieces.request]) & (
        pieces.decode == (pieces.request < num_decodes))
    # Block copies, both ways (the same rows on every rank).
    stage_sources = np.full(int(stage_rows.sum()), NO_SOURCE, dtype=np.int64)
    parent_sources = np.full(int(parent_rows.sum()), NO_SOURCE, dtype=np.int64)
    same_stage = block_ranges(stage_starts[same], stage_rows[same])
    same_parent = block_ranges(parent_starts[pieces.request[same]], stage_rows[same])
    stage_sources[same_stage] = same_parent
    parent_sources[same_parent] = same_stage
    # The differing requests, token by token in their own token space.
    differ = np.unique(pieces.request[~same])
    sub_counts = counts[differ]
    sub_starts = np.cumsum(sub_counts) - sub_counts
    piece_index = np.flatnonzero(~same)
    piece_sub_start = sub_starts[np.searchsorted(differ, pieces.request[piece_index])] + (
        pieces.token_offset[piece_index])
    stage_have = np.concatenate([
        _sub_sources(pieces.tokens[chosen], int(pieces.decode[chosen].sum()), pcp,
                     piece_sub_start[np.isin(piece_index, chosen)])
        for chosen in (piece_index[pieces.stage[piece_index] == s] for s in stages)], axis=1)
    parent_have = _sub_sources(sub_counts, int((differ < num_decodes).sum()), pcp, sub_starts)
    parent_full_rows = block_ranges(parent_starts[differ], parent_rows[differ])
    stage_full_rows = block_ranges(stage_starts[piece_index], stage_rows[piece_index])
    sub_tokens = int(sub_counts.sum())
    return _Layouts(
        pcp=pcp, pieces=pieces, stage_rows=stage_rows,
        stage_row_counts=tuple(int(stage_rows[pieces.stage == s].sum()) for s in stages),
        block_stage_sources=stage_sources, block_parent_sources=parent_sources, differ=differ,
        parent_full_rows=parent_full_rows, stage_full_rows=stage_full_rows,
        inbound=_direction(stage_have, parent_have, parent_full_rows, sub_tokens),
        outbound=_direction(parent_have, stage_have, stage_full_rows, sub_tokens),
    )


def _for_rank(layouts: _Layouts, rank: int) -> RankRelayout:
    stage_sources = layouts.block_stage_sources.copy()
    parent_sources = layouts.block_parent_sources.copy()
    inbound, inbound_sources = _exchange(layouts.inbound, rank, len(parent_sources))
    stage_sources[layouts.stage_full_rows] = inbound_sources
    outbound, outbound_sources = _exchange(layouts.outbound, rank, len(stage_sources))
    parent_sources[layouts.parent_full_rows] = outbound_sources
    return RankRelayout(
        pcp_size=layouts.pcp, pcp_rank=rank, parent_rows=len(parent_sources),
        stage_row_counts=layouts.stage_row_counts, inbound=inbound, stage_sources=stage_sources,
        stage_positions=rank_positions(layouts.stage_rows, layouts.pieces.computed,
                                       layouts.pieces.decode, layouts.pcp, rank),
        outbound=outbound, parent_sources=parent_sources, exchanged_requests=layouts.differ,
    )


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
    return _for_rank(_layouts(plan, num_computed_tokens), pcp_rank)


def all_rank_relayouts(plan: SplitPlan, num_computed_tokens) -> list[RankRelayout]:
    """``rank_relayout`` of every rank, the shared layouts built once (the CPU emulation)."""
    layouts = _layouts(plan, num_computed_tokens)
    return [_for_rank(layouts, rank) for rank in range(layouts.pcp)]


def _pool(rows, received, sources: np.ndarray):
    """Rows of ``[rows ; received]`` picked by ``sources`` (zeros at ``NO_SOURCE``), written
    into one fresh tensor: no concatenated copy of the local rows is made."""
    local = np.flatnonzero((sources >= 0) & (sources < len(rows)))
    remote = np.flatnonzero(sources >= len(rows))
    if isinstance(rows, np.ndarray):
        out = np.zeros((len(sources), *rows.shape[1:]), dtype=rows.dtype)
        out[local] = rows[sources[local]]
        out[remote] = received[sources[remote] - len(rows)]
        return out
    import torch  # lazy: numpy callers never pay for it

    def index(array: np.ndarray):
        return torch.from_numpy(array).to(rows.device)

    out = rows.new_zeros((len(sources), *rows.shape[1:]))
    out.index_copy_(0, index(local), rows.index_select(0, index(sources[local])))
    if len(remote):
        out.index_copy_(0, index(remote),
                        received.index_select(0, index(sources[remote] - len(rows))))
    return out


def _rows(rows, index: np.ndarray):
    if isinstance(rows, np.ndarray):
        return rows[index]
    import torch

    return rows.index_select(0, torch.from_numpy(index).to(rows.device))


def _check_rows(rows, expected: int, what: str, rank: int) -> None:
    if len(rows) != expected:
        raise ValueError(f"{len(rows)} {what} rows on PCP rank {rank}; the layout has {expected}")


def _moved(rows, exchange: Exchange, sources: np.ndarray, all_to_all: AllToAll):
    received = all_to_all(_rows(rows, exchange.send_rows), exchange.send_counts,
                          exchange.recv_counts)
    if len(received) != exchange.received_rows:
        raise ValueError(f"the all-to-all returned {len(received)} rows; "
                         f"{exchange.received_rows} were due")
    return _pool(rows, received, sources)


def relay_rows(relayout: RankRelayout, parent_rows, all_to_all: AllToAll):
    """This rank's stage rows (all stages, concatenated) from its parent rows [R, ...]."""
    _check_rows(parent_rows, relayout.parent_rows, "parent", relayout.pcp_rank)
    return _moved(parent_rows, relayout.inbound, relayout.stage_sources, all_to_all)


def restore_rows(relayout: RankRelayout, stage_rows_concat, all_to_all: AllToAll):
    """This rank's parent rows back from its stage rows (all stages, concatenated)."""
    _check_rows(stage_rows_concat, relayout.stage_rows, "stage", relayout.pcp_rank)
    return _moved(stage_rows_concat, relayout.outbound, relayout.parent_sources, all_to_all)


def _concat(parts: Sequence, like):
    if isinstance(like, np.ndarray):
        return np.concatenate(parts) if parts else like[:0]
    import torch

    return torch.cat(list(parts)) if parts else like[:0]


def emulated_all_to_all(per_rank_sends: Sequence, per_rank_exchanges: Sequence[Exchange],
                        receiver: int):
    """What ``receiver`` gets from an all-to-all of ranks held in one process: each rank's
    block for it (from that rank's sends and send counts), in rank order."""
    blocks = []
    for sent, exchange in zip(per_rank_sends, per_rank_exchanges, strict=True):
        start = int(sum(exchange.send_counts[:receiver]))
        blocks.append(sent[start:start + exchange.send_counts[receiver]])
    return _concat(blocks, per_rank_sends[receiver])


def _all_ranks(relayouts: Sequence[RankRelayout], per_rank_rows: Sequence, exchange_of,
               sources_of) -> list:
    exchanges = [exchange_of(relayout) for relayout in relayouts]
    sends = [_rows(rows, exchange.send_rows)
             for rows, exchange in zip(per_rank_rows, exchanges, strict=True)]
    return [_pool(rows, emulated_all_to_all(sends, exchanges, rank), sources_of(relayout))
            for rank, (relayout, rows) in enumerate(zip(relayouts, per_rank_rows, strict=True))]


def relay_all_ranks(relayouts: Sequence[RankRelayout], per_rank_parent_rows: Sequence) -> list:
    """``relay_rows`` of every rank held in one process (the CPU emulation)."""
    for relayout, rows in zip(relayouts, per_rank_parent_rows, strict=True):
        _check_rows(rows, relayout.parent_rows, "parent", relayout.pcp_rank)
    return _all_ranks(relayouts, per_rank_parent_rows, lambda r: r.inbound,
                      lambda r: r.stage_sources)


def restore_all_ranks(relayouts: Sequence[RankRelayout], per_rank_stage_rows: Sequence) -> list:
    """``restore_rows`` of every rank held in one process (the CPU emulation)."""
    for relayout, rows in zip(relayouts, per_rank_stage_rows, strict=True):
        _check_rows(rows, relayout.stage_rows, "stage", relayout.pcp_rank)
    return _all_ranks(relayouts, per_rank_stage_rows, lambda r: r.outbound,
                      lambda r: r.parent_sources)
