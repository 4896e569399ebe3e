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

Modules by job: :mod:`.config` (the configuration and validity checks),
:mod:`.plan` (chunks, batches, the plan and per-forward shapes), and this
module (admission and :func:`schedule`). Names the CLI and tests import from
here are re-exported.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_afd.scheduling.config import (  # noqa: F401  (re-exported)
    DEFAULT_MAX_BATCHED_TOKENS,
    DEFAULT_MAX_PREFILL_REQS,
    DEFAULT_PAGE_SIZE,
    DEFAULT_ROUND_CAPACITY,
    SchedulerConfig,
    ceil_div,
    config_reasons,
    require_int,
    round_down,
    round_up,
    unchunked_request_reasons,
)
from pytest_afd.scheduling.plan import (  # noqa: F401  (re-exported)
    JSON_FIRST_FORWARDS,
    ForwardBatch,
    ScheduledChunk,
    SchedulePlan,
    comm_rounds,
    forward_rows_per_rank,
    zigzag_rows_per_rank,
)

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
        require_int(f"prompt_lengths[{index}]", length, 1)
    if cached_tokens is None:
        return prompts, (0,) * len(prompts)
    cached = tuple(cached_tokens)
    if len(cached) != len(prompts):
        raise ValueError(
            f"cached_tokens has {len(cached)} entries for {len(prompts)} prompts; "
            "expected one per prompt"
        )
    for index, (length, hit) in enumerate(zip(prompts, cached, strict=True)):
        require_int(f"cached_tokens[{index}]", hit, 0)
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
