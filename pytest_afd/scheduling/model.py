"""The scheduling model: how a prefill chunk flag becomes forward batches.

Implements the design note ``shared/design/chunk-semantics.md`` layer by layer so that
a chunk candidate's batch shapes are known before any NPU time is spent:

1. DP folding: ``effective_chunk = global_chunk // dp_size``.
2. Page-granular admission with a request-slot cap; the budget is charged in
   whole pages and truncated pieces are page-aligned.
3. CP zigzag row padding, applied per request (each request of a forward is
   laid out in ``2 * cp`` zigzag chunks on its own).
4. Communication rounds: ``ceil(rows_per_rank / round_capacity)``.
5. Prefix hits: only the uncached suffix is scheduled.

The model simulates the queue that ONE data-parallel group's scheduler sees.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_PAGE_SIZE = 128
DEFAULT_MAX_PREFILL_REQS = 8
DEFAULT_MAX_BATCHED_TOKENS = 140_000
# DeepEP "normal" mode moves at most this many rows per rank per round.
DEFAULT_ROUND_CAPACITY = 8192
# Zigzag (DualChunkSwap) splits each request into this many chunks per CP rank.
ZIGZAG_CHUNKS_PER_RANK = 2
# How many per-forward values ``SchedulePlan.to_json`` lists before "max".
JSON_FIRST_FORWARDS = 8


def ceil_div(numerator: int, denominator: int) -> int:
    """Integer ceiling division (no float rounding on large token counts)."""
    return -(-numerator // denominator)


def round_up(value: int, multiple: int) -> int:
    return ceil_div(value, multiple) * multiple


def round_down(value: int, multiple: int) -> int:
    return (value // multiple) * multiple


def _require_int(name: str, value: object, minimum: int) -> None:
    # bool is an int subclass; True as a page size is a caller bug, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r}; expected an integer")
    if value < minimum:
        raise ValueError(f"{name}={value!r}; expected an integer >= {minimum}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Everything that decides batch shapes. Field values are the flags as given.

    ``chunk_size`` is the GLOBAL flag (None = chunked prefill disabled). A
    combination the stack would accept but that is invalid for measurement
    (e.g. a chunk that is not a page multiple) is NOT an error here: it makes
    the :class:`SchedulePlan` invalid with a reason. Nonsense (a zero chunk, a
    negative size) raises ``ValueError`` at construction.
    """

    chunk_size: int | None
    dp_size: int = 1
    cp_size: int = 1
    page_size: int = DEFAULT_PAGE_SIZE
    max_prefill_reqs: int = DEFAULT_MAX_PREFILL_REQS
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    round_capacity: int = DEFAULT_ROUND_CAPACITY
    # Max running sequences (vLLM max_num_seqs). Prefill-only requests finish
    # with their final chunk, so this caps requests per batch like Pcap.
    max_running_seqs: int | None = None

    def __post_init__(self) -> None:
        if self.chunk_size is not None:
            _require_int("chunk_size", self.chunk_size, 1)
        _require_int("dp_size", self.dp_size, 1)
        _require_int("cp_size", self.cp_size, 1)
        _require_int("page_size", self.page_size, 1)
        _require_int("max_prefill_reqs", self.max_prefill_reqs, 1)
        _require_int("max_batched_tokens", self.max_batched_tokens, 1)
        _require_int("round_capacity", self.round_capacity, 1)
        if self.max_running_seqs is not None:
            _require_int("max_running_seqs", self.max_running_seqs, 1)

    @property
    def chunked(self) -> bool:
        return self.chunk_size is not None

    @property
    def effective_chunk(self) -> int | None:
        """The per-DP-group budget: ``chunk_size // dp_size`` (None when unchunked)."""
        if self.chunk_size is None:
            return None
        return self.chunk_size // self.dp_size

    @property
    def token_budget(self) -> int:
        """What one batch may be charged: the effective chunk, or max batched tokens."""
        effective = self.effective_chunk
        return self.max_batched_tokens if effective is None else effective

    @property
    def request_slots(self) -> int:
        """Requests one batch may hold: Pcap, further capped by max running sequences."""
        if self.max_running_seqs is None:
            return self.max_prefill_reqs
        return min(self.max_prefill_reqs, self.max_running_seqs)

    def describe_chunk(self) -> str:
        return "unchunked" if self.chunk_size is None else str(self.chunk_size)

    def to_json(self) -> dict[str, Any]:
        return {
            "chunk_size": self.chunk_size,
            "dp_size": self.dp_size,
            "cp_size": self.cp_size,
            "page_size": self.page_size,
            "max_prefill_reqs": self.max_prefill_reqs,
            "max_batched_tokens": self.max_batched_tokens,
            "round_capacity": self.round_capacity,
            "max_running_seqs": self.max_running_seqs,
        }


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


# ---------------------------------------------------------------------------
# Validity: sizes the stack may accept but that must be reported, not measured


def config_reasons(config: SchedulerConfig) -> list[str]:
    """Why a chunk configuration is invalid (empty when it is valid)."""
    if config.chunk_size is None:
        return []
    reasons: list[str] = []
    chunk, dp_size, page = config.chunk_size, config.dp_size, config.page_size
    effective = chunk // dp_size
    if chunk % dp_size:
        reasons.append(
            f"chunk {chunk} cannot be folded evenly by dp {dp_size} "
            f"({chunk} % {dp_size} = {chunk % dp_size}; effective chunk would be {effective})"
        )
    if effective < page:
        reasons.append(
            f"effective chunk {effective} (chunk {chunk} // dp {dp_size}) is smaller than "
            f"one page of {page} tokens: no page-aligned piece fits the budget"
        )
    elif effective % page:
        reasons.append(
            f"effective chunk {effective} (chunk {chunk} // dp {dp_size}) is not a multiple "
            f"of page size {page}: page charging can exceed the budget"
        )
    if effective > config.max_batched_tokens:
        reasons.append(
            f"effective chunk {effective} exceeds max batched tokens {config.max_batched_tokens}"
        )
    return reasons


def unchunked_request_reasons(new_tokens: Sequence[int], config: SchedulerConfig) -> list[str]:
    """Unchunked, a request is scheduled whole: its page-charged length must fit one batch."""
    reasons = []
    for index, tokens in enumerate(new_tokens):
        charged = round_up(tokens, config.page_size)
        if charged > config.max_batched_tokens:
            reasons.append(
                f"unchunked: request {index} needs {charged} tokens of budget ({tokens} "
                f"uncached tokens in whole {config.page_size}-token pages) > max batched "
                f"tokens {config.max_batched_tokens}"
            )
    return reasons


# ---------------------------------------------------------------------------
# Admission (chunk-semantics §2)


@dataclass
class _Pending:
    """A request's unscheduled suffix while the simulation runs."""

    index: int
    remaining: int
    computed: int


def _take(pending: _Pending, tokens: int) -> ScheduledChunk:
    chunk = ScheduledChunk(
        request_index=pending.index,
        num_tokens=tokens,
        num_computed_tokens=pending.computed,
        is_final=tokens == pending.remaining,
    )
    pending.remaining -= tokens
    pending.computed += tokens
    return chunk


def _fill_batch(
    queue: deque[_Pending], chunked: _Pending | None, config: SchedulerConfig
) -> tuple[list[ScheduledChunk], list[bool], int, _Pending | None]:
    """Fill one batch; returns (chunks, is-continuation flags, charged, next chunked request)."""
    page, budget, slots = config.page_size, config.token_budget, config.request_slots
    chunks: list[ScheduledChunk] = []
    continuation: list[bool] = []
    charged = 0
    if chunked is not None:
        # 1. The chunked request continues first.
        if chunked.remaining > budget:
            piece = round_down(budget, page)
            chunks.append(_take(chunked, piece))
            charged += piece
        else:
            charged += round_up(chunked.remaining, page)
            chunks.append(_take(chunked, chunked.remaining))
            chunked = None
        continuation.append(True)
    # 2. New requests while a slot and budget remain.
    while chunked is None and queue and len(chunks) < slots and charged < budget:
        left = budget - charged
        head = queue[0]
        cost = round_up(head.remaining, page)
        if cost <= left:
            queue.popleft()
            chunks.append(_take(head, head.remaining))
            charged += cost
        elif config.chunked and round_down(left, page) > 0:
            queue.popleft()
            piece = round_down(left, page)
            chunks.append(_take(head, piece))
            charged += piece
            chunked = head
        else:
            break
        continuation.append(False)
    return chunks, continuation, charged, chunked


def _make_batch(
    chunks: list[ScheduledChunk], continuation: list[bool], charged: int, config: SchedulerConfig
) -> ForwardBatch:
    num_tokens = sum(chunk.num_tokens for chunk in chunks)
    rows = forward_rows_per_rank([chunk.num_tokens for chunk in chunks], config.cp_size)
    is_tail = (
        all(continuation)
        and all(chunk.is_final for chunk in chunks)
        and num_tokens < config.page_size
    )
    return ForwardBatch(
        chunks=tuple(chunks),
        num_tokens=num_tokens,
        charged_tokens=charged,
        rows_per_rank=rows,
        comm_rounds=comm_rounds(rows, config.round_capacity),
        is_tail_batch=is_tail,
    )


def _validate_queue(
    prompt_lengths: Sequence[int], cached_tokens: Sequence[int] | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    prompts = tuple(prompt_lengths)
    for index, length in enumerate(prompts):
        _require_int(f"prompt_lengths[{index}]", length, 1)
    if cached_tokens is None:
        return prompts, (0,) * len(prompts)
    cached = tuple(cached_tokens)
    if len(cached) != len(prompts):
        raise ValueError(
            f"cached_tokens has {len(cached)} entries for {len(prompts)} prompts; "
            "expected one per prompt"
        )
    for index, (length, hit) in enumerate(zip(prompts, cached, strict=True)):
        _require_int(f"cached_tokens[{index}]", hit, 0)
        if hit >= length:
            raise ValueError(
                f"cached_tokens[{index}]={hit} for a {length}-token prompt; at least one "
                "token must be computed (a hit is capped at prompt - 1)"
            )
    return prompts, cached


def schedule(
    prompt_lengths: Sequence[int],
    *,
    config: SchedulerConfig,
    cached_tokens: Sequence[int] | None = None,
) -> SchedulePlan:
    """Schedule a prefill queue (in order) into forward batches.

    ``cached_tokens`` are REALIZED prefix hits per request (whole blocks, from
    :class:`~pytest_afd.scheduling.PrefixCacheIndex` or the runtime): only
    ``prompt - cached`` tokens are scheduled, starting at ``cached``. Raises
    ``ValueError`` on nonsense input; an inadmissible configuration returns an
    invalid plan with reasons instead.
    """
    prompts, cached = _validate_queue(prompt_lengths, cached_tokens)
    new_tokens = [length - hit for length, hit in zip(prompts, cached, strict=True)]
    reasons = config_reasons(config)
    if not config.chunked:
        reasons += unchunked_request_reasons(new_tokens, config)
    if reasons:
        return SchedulePlan(
            config=config,
            effective_chunk=config.effective_chunk,
            batches=(),
            forwards_per_request=(),
            total_scheduled_tokens=0,
            valid=False,
            reasons=tuple(reasons),
            prompt_lengths=prompts,
            cached_tokens=cached,
        )
    queue = deque(
        _Pending(index=i, remaining=n, computed=hit)
        for i, (n, hit) in enumerate(zip(new_tokens, cached, strict=True))
    )
    forwards = [0] * len(prompts)
    batches: list[ForwardBatch] = []
    chunked: _Pending | None = None
    while queue or chunked is not None:
        chunks, continuation, charged, chunked = _fill_batch(queue, chunked, config)
        for chunk in chunks:
            forwards[chunk.request_index] += 1
        batches.append(_make_batch(chunks, continuation, charged, config))
    return SchedulePlan(
        config=config,
        effective_chunk=config.effective_chunk,
        batches=tuple(batches),
        forwards_per_request=tuple(forwards),
        total_scheduled_tokens=sum(batch.num_tokens for batch in batches),
        valid=True,
        reasons=(),
        prompt_lengths=prompts,
        cached_tokens=cached,
    )
