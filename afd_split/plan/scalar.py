"""The scalar planner: plain Python for small batches, where numpy's per-call cost dominates.

At the recipe's batch sizes (``--max-num-seqs`` 8 to 32) a plan is a handful
of integer operations; converting to arrays and calling ufuncs costs more than
the work itself. This planner takes Python ints (or a small int array via
``tolist``), builds the same plan as ``plan_vectorised`` (a property test
holds them identical) and leaves ``SplitPlan.token_counts`` to be made on first
read. Inputs it does not take, it hands back (``None``) so the vectorised path
names their errors.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate

import numpy as np

from afd_split.errors import SplitRejectedError
from afd_split.plan.constraints import MIN_PCP_FOR_ZIGZAG, SplitConstraints, SplitPolicy
from afd_split.plan.policies.request_boundary import (
    MIN_REQUESTS_FOR_BOUNDARY_SPLIT,
    request_boundary_cut,
)
from afd_split.plan.policies.token_balanced import token_balanced_cut
from afd_split.plan.types import (
    INT64,
    INT64_MAX,
    SplitPlan,
    UBatch,
    built_plan,
    check_cut,
    cut_plan,
    cut_sides,
    fallback_impossible,
    padded_ubatch,
    ubatch_record,
)

SCALAR_PATH_MAX_REQUESTS = 64
"""Largest batch the scalar planner takes; above it the vectorised planner is faster."""

SCALAR_POLICIES = frozenset(
    {SplitPolicy.NONE, SplitPolicy.REQUEST_BOUNDARY, SplitPolicy.TOKEN_BALANCED}
)
"""Policies with a scalar cut (cost_balanced models per-token costs with numpy)."""

# Enum attribute reads and Enum hashing run Python code; the hot path compares identities.
_NONE, _TOKEN_BALANCED = SplitPolicy.NONE, SplitPolicy.TOKEN_BALANCED

ONE_REQUEST_REJECTION = "request_boundary: a batch of 1 request(s) has no interior boundary"
"""``request_boundary_cut``'s rejection of a one-request batch (the path test compares them)."""

_tuple_new = tuple.__new__  # one global read per record on the per-step path


def scalar_counts(values, minimum: int) -> tuple[int, ...] | None:
    """``values`` as a tuple of Python ints in [minimum, int64 max], or None when it is not
    a small 1-D list / tuple / integer array of such values (the vectorised path decides)."""
    kind = type(values)
    if kind is np.ndarray:
        dtype = values.dtype
        if dtype is INT64:  # the engine's array: no uint64 range to check
            if values.ndim != 1 or not 0 < values.size <= SCALAR_PATH_MAX_REQUESTS:
                return None
            counts = tuple(values.tolist())
            return counts if min(counts) >= minimum else None
        if values.ndim != 1 or not 0 < values.size <= SCALAR_PATH_MAX_REQUESTS:
            return None
        if dtype.kind not in "iu":
            return None
        counts = tuple(values.tolist())
        # Only uint64 holds values past int64 max; other integer dtypes need the minimum only.
        if min(counts) < minimum or (dtype.kind == "u" and max(counts) > INT64_MAX):
            return None
        return counts
    if kind is not list and kind is not tuple:
        return None
    # bool, float, np.int64 entries: decline (issuperset stops at the first other type).
    if not 0 < len(values) <= SCALAR_PATH_MAX_REQUESTS or not _JUST_INT.issuperset(
        map(type, values)
    ):
        return None
    if min(values) < minimum or max(values) > INT64_MAX:
        return None
    return tuple(values)


_JUST_INT = frozenset({int})


def _read_only(values: list[int]) -> np.ndarray:
    array = np.array(values, dtype=INT64)
    array.setflags(write=False)
    return array


def _ubatch(index, token_start, token_stop, request_start, request_stop, pieces, constraints, rows):
    """``plan_vector._ubatch`` on Python ints (``pieces`` a list, or None without PCP)."""
    align = constraints.align
    row_multiple = constraints.pcp_row_multiple
    if row_multiple == 1:
        needed = -(-(token_stop - token_start) // align) * align
        piece_tokens = piece_row_starts = None
    else:
        starts, cursor = [], 0
        for piece in pieces:
            starts.append(cursor)
            cursor += -(-piece // row_multiple) * row_multiple
        needed = -(-cursor // align) * align
        piece_tokens, piece_row_starts = _read_only(pieces), _read_only(starts)
    return padded_ubatch(
        index,
        token_start,
        token_stop,
        request_start,
        request_stop,
        constraints,
        rows,
        needed,
        piece_tokens,
        piece_row_starts,
    )


def _unsplit(policy, counts, num_tokens, constraints, fallback_reason):
    if constraints.padded_total is None and constraints.pcp_size < MIN_PCP_FOR_ZIGZAG:
        # One plain ubatch: its rows are the batch's tokens rounded up to align.
        ubatch = ubatch_record(0, 0, num_tokens, 0, len(counts), -num_tokens % constraints.align)
        return _tuple_new(
            SplitPlan, (policy, counts, constraints, None, (ubatch,), None, 0, 0, fallback_reason)
        )
    pieces = list(counts) if constraints.pcp_size >= MIN_PCP_FOR_ZIGZAG else None
    ubatch = _ubatch(
        0, 0, num_tokens, 0, len(counts), pieces, constraints, constraints.padded_total
    )
    return built_plan(
        policy,
        counts,
        constraints,
        None,
        (ubatch,),
        None,
        0,
        0,
        fallback_reason,
    )


def _split(policy, counts, cu_tokens, constraints, cut):
    num_tokens = cu_tokens[-1]
    num_requests = len(counts)
    check_cut(cut, num_tokens)
    straddling = bisect_right(cu_tokens, cut)  # first request ending after the cut
    sides = cut_sides(cut, straddling, cu_tokens[straddling], counts[straddling])
    boundary, head_stop, head_tokens, tail_tokens = sides
    head_pieces = tail_pieces = None
    if constraints.pcp_size >= MIN_PCP_FOR_ZIGZAG:
        head_pieces, tail_pieces = list(counts[:head_stop]), list(counts[straddling:])
        if boundary is not None:
            head_pieces[-1], tail_pieces[0] = head_tokens, tail_tokens
    return cut_plan(
        policy, counts, constraints, cut, num_tokens, num_requests, straddling, sides,
        head_pieces, tail_pieces, _ubatch,
    )


def _plain_split(policy, counts, cu_tokens, constraints, cut, align):
    """``_split`` without padded_total or PCP, for a cut known to be inside (0, T): each
    ubatch's rows are its real tokens rounded up to align. Records are built directly."""
    num_tokens = cu_tokens[-1]
    straddling = bisect_right(cu_tokens, cut)  # first request ending after the cut
    tail_tokens = cu_tokens[straddling] - cut
    head_tokens = counts[straddling] - tail_tokens
    if head_tokens:
        boundary, head_stop = straddling, straddling + 1
    else:
        boundary, head_stop, tail_tokens = None, straddling, 0
    tail_real = num_tokens - cut
    # UBatch / SplitPlan fields in order (plain_ubatch and built_plan, inlined).
    head = _tuple_new(
        UBatch, (0, slice(0, cut), slice(0, head_stop), cut, -cut % align, None, None)
    )
    tail = _tuple_new(
        UBatch,
        (
            1,
            slice(cut, num_tokens),
            slice(straddling, len(counts)),
            tail_real,
            -tail_real % align,  # round_up(tail_real, align) - tail_real
            None,
            None,
        ),
    )
    return _tuple_new(
        SplitPlan,
        (policy, counts, constraints, cut, (head, tail), boundary, head_tokens, tail_tokens, None),
    )


def _plain_boundary_cut(cu_tokens, num_tokens, min_tokens):
    """``request_boundary_cut`` when every interior boundary leaves ``min_tokens`` on both
    sides (always so for min_ubatch_tokens=1); None otherwise, for the general search.

    The prefix sums strictly increase, so checking the first and the last interior
    boundary covers them all, and the best cut is one of the two around T/2.
    """
    last = len(cu_tokens) - 2  # boundary k puts k + 1 requests in the head
    if cu_tokens[0] < min_tokens or num_tokens - cu_tokens[last] < min_tokens:
        return None
    upper = bisect_left(cu_tokens, (num_tokens + 1) // 2, 0, last + 1)
    below = upper - 1 if upper else 0
    above = upper if upper <= last else last
    cut_below, cut_above = cu_tokens[below], cu_tokens[above]
    off_below, off_above = abs(2 * cut_below - num_tokens), abs(2 * cut_above - num_tokens)
    if off_below != off_above:
        return cut_below if off_below < off_above else cut_above
    num_requests = last + 2
    # Ties: the more even request count, then fewer head requests (below < above).
    if abs(2 * below + 2 - num_requests) <= abs(2 * above + 2 - num_requests):
        return cut_below
    return cut_above


def plan_scalar(
    policy: SplitPolicy,
    counts: tuple[int, ...],
    constraints: SplitConstraints,
    allow_fallback: bool,
) -> SplitPlan:
    """``plan_split`` for ``scalar_counts`` output and a policy in ``SCALAR_POLICIES``."""
    cu_tokens = list(accumulate(counts))
    num_tokens = cu_tokens[-1]
    if num_tokens > INT64_MAX:
        raise ValueError(
            f"num_scheduled_tokens add up to {num_tokens} tokens, past the int64 limit {INT64_MAX}"
        )
    padded_total = constraints.padded_total
    if padded_total is not None:
        constraints.total_rows_for(num_tokens)  # ValueError when below round_up(T)
    if policy is _NONE:
        return _unsplit(policy, counts, num_tokens, constraints, None)
    plain = padded_total is None and constraints.pcp_size < MIN_PCP_FOR_ZIGZAG
    if policy is _TOKEN_BALANCED:
        align, min_tokens = constraints.align, constraints.min_ubatch_tokens
        lowest = -(-min_tokens // align) * align
        highest = (num_tokens - min_tokens) // align * align
        if plain and align < num_tokens and lowest <= highest:
            # token_balanced_cut inlined: its cut lies in [lowest, highest], inside (0, T).
            cut = (num_tokens + align) // (2 * align) * align
            cut = lowest if cut < lowest else highest if cut > highest else cut
            return _plain_split(policy, counts, cu_tokens, constraints, cut, align)
    elif len(counts) < MIN_REQUESTS_FOR_BOUNDARY_SPLIT:
        # request_boundary's one-request rejection, without raising and catching it.
        if not allow_fallback:
            raise SplitRejectedError(ONE_REQUEST_REJECTION)
        return _fallback(policy, counts, num_tokens, constraints, ONE_REQUEST_REJECTION)
    elif plain:
        cut = _plain_boundary_cut(cu_tokens, num_tokens, constraints.min_ubatch_tokens)
        if cut is not None:
            return _plain_split(policy, counts, cu_tokens, constraints, cut, constraints.align)
    try:
        if policy is _TOKEN_BALANCED:
            cut = token_balanced_cut(num_tokens, constraints)
        else:
            cut = request_boundary_cut(cu_tokens, constraints)  # a boundary inside (0, T)
            if plain:
                return _plain_split(policy, counts, cu_tokens, constraints, cut, constraints.align)
        return _split(policy, counts, cu_tokens, constraints, cut)
    except SplitRejectedError as rejection:
        if not allow_fallback:
            raise
        reason = str(rejection)
    return _fallback(policy, counts, num_tokens, constraints, reason)


def _fallback(policy, counts, num_tokens, constraints, reason):
    try:
        return _unsplit(policy, counts, num_tokens, constraints, reason)
    except SplitRejectedError as impossible:
        raise fallback_impossible(reason, impossible) from None
