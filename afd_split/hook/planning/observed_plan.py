"""A ``SplitPlan`` describing a split some other planner made (evidence-only recording).

The AFD plugin's own ``request`` planner and its unsplit ``none`` path decide a
step without afd_split. To give those controls the same step evidence as
``token_balanced`` (real and padded tokens per ubatch, imbalance, boundary
request), the evidence-only hook describes the plugin's decision as a
``SplitPlan`` after the fact: the plugin's ``UBatchSlice`` request and token
ranges, checked to be contiguous and to hold exactly their requests' scheduled
tokens, never re-planned. Framework-neutral: plain ints and slices in, a plan out.
"""

from __future__ import annotations

from collections.abc import Sequence

from afd_split.plan.constraints import SplitConstraints, SplitPolicy
from afd_split.plan.types import built_plan, ubatch_record

OBSERVED_CONSTRAINTS = SplitConstraints()
"""An observed plan was made without afd_split's constraints: recorded as the defaults."""

MAX_OBSERVED_STAGES = 2
"""The plugin's async-MoE ubatching runs one or two stages (``async_moe_num_ubatches``)."""


def _checked_counts(num_scheduled_tokens) -> tuple[int, ...]:
    counts = tuple(int(count) for count in num_scheduled_tokens)
    if not counts or any(count < 1 for count in counts):
        raise ValueError(f"scheduled tokens per request must be >= 1, got {list(counts)}")
    return counts


def observed_plan(num_scheduled_tokens: Sequence[int], stages: Sequence[tuple[slice, slice]] | None,
                  *, policy: SplitPolicy, num_input_rows: int | None = None,
                  unsplit_reason: str | None = None):
    """The plan of a step another planner ran: ``stages`` are its ``(request_slice,
    token_slice)`` pairs, or None when it ran the batch unsplit (``unsplit_reason`` says
    why, when that was a planner's decision rather than the policy).

    An unsplit step is one ubatch over the parent's rows: ``num_input_rows`` (the
    engine's padded rows) minus the real tokens are its padding. Split stages hold the
    rows their token slices name (the plugin's stages carry no padding rows). Raises
    ``ValueError`` naming what does not add up (a gap, an overlap, a stage whose tokens
    are not its requests' tokens).
    """
    counts = _checked_counts(num_scheduled_tokens)
    num_tokens, num_requests = sum(counts), len(counts)
    if not stages:
        rows = num_tokens if num_input_rows is None else int(num_input_rows)
        if rows < num_tokens:
            raise ValueError(f"the parent has {rows} rows for {num_tokens} scheduled tokens")
        ubatch = ubatch_record(0, 0, num_tokens, 0, num_requests, rows - num_tokens)
        return built_plan(policy, counts, OBSERVED_CONSTRAINTS, None, (ubatch,), None, 0, 0,
                          unsplit_reason)
    if len(stages) != MAX_OBSERVED_STAGES:
        raise ValueError(f"{len(stages)} stages; the recorded plan format holds 2")
    ubatches, token_at, request_at = [], 0, 0
    for index, (request_slice, token_slice) in enumerate(stages):
        if (request_slice.start, token_slice.start) != (request_at, token_at):
            raise ValueError(f"stage {index} starts at request {request_slice.start}, token "
                             f"{token_slice.start}; expected request {request_at}, token {token_at}")
        tokens = sum(counts[request_slice.start:request_slice.stop])
        if token_slice.stop - token_slice.start != tokens or request_slice.stop <= request_slice.start:
            raise ValueError(f"stage {index} holds tokens [{token_slice.start}, {token_slice.stop}) "
                             f"but its requests [{request_slice.start}, {request_slice.stop}) "
                             f"have {tokens} scheduled tokens")
        ubatches.append(ubatch_record(index, token_slice.start, token_slice.stop,
                                      request_slice.start, request_slice.stop, 0))
        token_at, request_at = token_slice.stop, request_slice.stop
    if (request_at, token_at) != (num_requests, num_tokens):
        raise ValueError(f"the stages end at request {request_at}, token {token_at}; the batch "
                         f"has {num_requests} requests, {num_tokens} tokens")
    return built_plan(policy, counts, OBSERVED_CONSTRAINTS, ubatches[1].token_slice.start,
                      tuple(ubatches), None, 0, 0, None)
