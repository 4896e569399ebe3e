"""What a schedule produces: chunks, forward batches and the plan, and each forward's shape
(CP zigzag rows and communication rounds, chunk-semantics layers 3-4)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_afd.scheduling.config import SchedulerConfig, ceil_div, round_up

# Zigzag (DualChunkSwap) splits each request into this many chunks per CP rank.
ZIGZAG_CHUNKS_PER_RANK = 2
# How many per-forward values ``SchedulePlan.to_json`` lists before "max".
JSON_FIRST_FORWARDS = 8


@dataclass(frozen=True)
class ScheduledChunk:
    """One request's piece of one forward.

    ``num_computed_tokens`` = tokens already in the KV cache for that request
    (cached prefix + earlier chunks); the piece covers positions
    ``[num_computed_tokens, num_computed_tokens + num_tokens)``.
    """

    request_index: int
    num_tokens: int
    num_computed_tokens: int
    is_final: bool


@dataclass(frozen=True)
class ForwardBatch:
    """One prefill forward: its chunks in scheduler order (continuing request first)."""

    chunks: tuple[ScheduledChunk, ...]
    num_tokens: int
    # Budget charged: every piece rounded up to whole pages.
    charged_tokens: int
    # Rows each CP rank carries into the collectives (after zigzag padding).
    rows_per_rank: int
    comm_rounds: int
    # The batch's only work is the tail (below one page) of a chunked request.
    is_tail_batch: bool

    @property
    def num_requests(self) -> int:
        return len(self.chunks)

    @property
    def num_scheduled_tokens(self) -> tuple[int, ...]:
        """Per-request query lengths, the shape ``afd_split.plan_split`` takes."""
        return tuple(chunk.num_tokens for chunk in self.chunks)

    @property
    def num_computed_tokens(self) -> tuple[int, ...]:
        return tuple(chunk.num_computed_tokens for chunk in self.chunks)

    @property
    def request_indices(self) -> tuple[int, ...]:
        return tuple(chunk.request_index for chunk in self.chunks)

    @property
    def context_tokens(self) -> int:
        """KV tokens this forward's attention reads: a prefix hit shrinks the new
        tokens, not the history read (chunk-semantics §5)."""
        return sum(chunk.num_computed_tokens + chunk.num_tokens for chunk in self.chunks)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": list(self.request_indices),
            "num_scheduled_tokens": list(self.num_scheduled_tokens),
            "num_computed_tokens": list(self.num_computed_tokens),
            "num_tokens": self.num_tokens,
            "charged_tokens": self.charged_tokens,
            "context_tokens": self.context_tokens,
            "rows_per_rank": self.rows_per_rank,
            "comm_rounds": self.comm_rounds,
            "is_tail_batch": self.is_tail_batch,
        }


@dataclass(frozen=True)
class SchedulePlan:
    """The batches a configuration produces for a queue, or why it is invalid.

    An invalid plan has no batches: such a size is reported, never measured.
    """

    config: SchedulerConfig
    effective_chunk: int | None
    batches: tuple[ForwardBatch, ...]
    forwards_per_request: tuple[int, ...]
    total_scheduled_tokens: int
    valid: bool
    reasons: tuple[str, ...]
    prompt_lengths: tuple[int, ...] = ()
    cached_tokens: tuple[int, ...] = ()

    @property
    def num_batches(self) -> int:
        return len(self.batches)

    @property
    def token_budget(self) -> int:
        return self.config.token_budget

    @property
    def tail_batch_indices(self) -> tuple[int, ...]:
        return tuple(i for i, batch in enumerate(self.batches) if batch.is_tail_batch)

    @property
    def num_tail_batches(self) -> int:
        return len(self.tail_batch_indices)

    @property
    def max_rows_per_rank(self) -> int:
        return max((batch.rows_per_rank for batch in self.batches), default=0)

    @property
    def max_comm_rounds(self) -> int:
        return max((batch.comm_rounds for batch in self.batches), default=0)

    @property
    def total_comm_rounds(self) -> int:
        return sum(batch.comm_rounds for batch in self.batches)

    @property
    def padding_rows_per_rank(self) -> int:
        """Zigzag padding rows summed over forwards (per rank): rows that carry no token."""
        cp_size = self.config.cp_size
        return sum(
            batch.rows_per_rank - sum(ceil_div(c.num_tokens, cp_size) for c in batch.chunks)
            for batch in self.batches
        )

    def chunks_of(self, request_index: int) -> tuple[int, ...]:
        """Token counts of one request's pieces, in forward order."""
        return tuple(
            chunk.num_tokens
            for batch in self.batches
            for chunk in batch.chunks
            if chunk.request_index == request_index
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (the planner CLI's ``--json`` output for one plan)."""
        rows = [batch.rows_per_rank for batch in self.batches]
        rounds = [batch.comm_rounds for batch in self.batches]
        return {
            "global_chunk": self.config.chunk_size,
            "dp_size": self.config.dp_size,
            "effective_chunk": self.effective_chunk,
            "token_budget": self.token_budget,
            "valid": self.valid,
            "reasons": list(self.reasons),
            "num_requests": len(self.prompt_lengths),
            "num_batches": self.num_batches,
            "total_scheduled_tokens": self.total_scheduled_tokens,
            "forwards_per_request": list(self.forwards_per_request),
            "chunks": list(self.chunks_of(0)) if self.prompt_lengths else [],
            "rows_per_rank": {"first": rows[:JSON_FIRST_FORWARDS], "max": max(rows, default=0)},
            "comm_rounds": {
                "first": rounds[:JSON_FIRST_FORWARDS],
                "max": max(rounds, default=0),
                "total": sum(rounds),
            },
            "padding_rows_per_rank": self.padding_rows_per_rank,
            "context_tokens": {
                "first": [b.context_tokens for b in self.batches[:JSON_FIRST_FORWARDS]],
                "max": max((b.context_tokens for b in self.batches), default=0),
            },
            "tail_batches": self.num_tail_batches,
            "tail_batch_indices": list(self.tail_batch_indices),
            "requests_per_batch": {
                "first": [b.num_requests for b in self.batches[:JSON_FIRST_FORWARDS]],
                "max": max((b.num_requests for b in self.batches), default=0),
            },
            "cached_tokens": {
                "total": sum(self.cached_tokens),
                "per_request_first": list(self.cached_tokens[:JSON_FIRST_FORWARDS]),
            },
            "config": self.config.to_json(),
        }


# ---------------------------------------------------------------------------
# Per-forward shape: CP zigzag rows and communication rounds


def zigzag_rows_per_rank(num_tokens: int, cp_size: int) -> int:
    """Rows one CP rank holds for ONE request's piece.

    ``ceil(tokens / cp)`` padded up to a multiple of ``2 * cp`` (chunk-semantics
    §3). Without CP (cp == 1) there is no zigzag layout and no padding.
    """
    if cp_size == 1:
        return num_tokens
    return round_up(ceil_div(num_tokens, cp_size), ZIGZAG_CHUNKS_PER_RANK * cp_size)


def forward_rows_per_rank(piece_tokens: Sequence[int], cp_size: int) -> int:
    """A forward's rows per rank: the zigzag layout pads each request separately."""
    return sum(zigzag_rows_per_rank(tokens, cp_size) for tokens in piece_tokens)


def comm_rounds(rows_per_rank: int, round_capacity: int) -> int:
    """Dispatch/combine rounds one forward needs (a non-empty forward needs >= 1)."""
    return ceil_div(rows_per_rank, round_capacity)
