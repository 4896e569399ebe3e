"""The planner: where the cut falls, which requests each ubatch holds, and its padding rows.

A plan is pure data derived from the per-request scheduled token counts; it never touches
metadata arrays, so every rank can compute (and cross-check) it cheaply before any per-ubatch
work starts. One planner, numpy over the counts (O(1) numpy calls per plan): a plain-Python
twin for small batches saved microseconds of a step that takes about a second (issue 33).
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from afd_split.errors import SplitRejectedError
from afd_split.plan.constraints import MIN_PCP_FOR_ZIGZAG, SplitConstraints, SplitPolicy
from afd_split.plan.policies import CUT_SELECTORS
from afd_split.plan.types import (
    INT64,
    INT64_MAX,
    SplitPlan,
    UBatch,
    _built,
    built_plan,
    check_cut,
    cut_plan,
    cut_sides,
    fallback_impossible,
    padded_ubatch,
)

DEFAULT_CONSTRAINTS = SplitConstraints()

POLICY_BY_VALUE = MappingProxyType({policy.value: policy for policy in SplitPolicy})
"""Policy lookup by string without the cost of an Enum call on the per-step path."""

__all__ = [
    "DEFAULT_CONSTRAINTS",
    "INT64",
    "POLICY_BY_VALUE",
    "SplitPlan",
    "UBatch",
    "_built",
    "as_token_counts",
    "matched_computed_counts",
    "plan_split",
    "plan_unsplit",
    "prefix_sums",
]


def plan_split(
    num_scheduled_tokens,
    *,
    policy: SplitPolicy | str,
    constraints: SplitConstraints = DEFAULT_CONSTRAINTS,
    allow_fallback: bool = False,
    num_computed_tokens=None,
) -> SplitPlan:
    """Plan how one prefill batch runs: unsplit (``none``) or as two ubatches.

    Raises ``SplitRejectedError`` when the policy cannot split this batch; with
    ``allow_fallback=True`` the batch runs unsplit instead and the plan records
    ``fallback_reason`` (or, when the unsplit batch does not fit padded_total
    either, ``SplitRejectedError`` gives both reasons). Invalid inputs raise
    ``ValueError`` naming the value; totals past int64 are refused.
    """
    if type(policy) is not SplitPolicy:  # Enum hashing runs Python code: look strings up
        policy = POLICY_BY_VALUE[policy] if policy in POLICY_BY_VALUE else SplitPolicy(policy)
    return plan_vectorised(
        policy, num_scheduled_tokens, constraints, allow_fallback, num_computed_tokens
    )


def plan_unsplit(
    num_scheduled_tokens,
    *,
    policy: SplitPolicy | str,
    reason: str,
    constraints: SplitConstraints = DEFAULT_CONSTRAINTS,
    num_computed_tokens=None,
) -> SplitPlan:
    """The batch as one ubatch because the caller decided not to split it (``reason``, recorded
    as the plan's ``fallback_reason``), e.g. a step below the hook's split threshold.

    The inputs are checked as ``plan_split`` checks them; ``SplitRejectedError`` when the
    unsplit batch does not fit ``padded_total``.
    """
    if type(policy) is not SplitPolicy:
        policy = POLICY_BY_VALUE[policy] if policy in POLICY_BY_VALUE else SplitPolicy(policy)
    tokens = as_token_counts(num_scheduled_tokens, name="num_scheduled_tokens", minimum=1)
    if num_computed_tokens is not None:
        matched_computed_counts(num_computed_tokens, tokens)
    cu_tokens = prefix_sums(tokens, name="num_scheduled_tokens")
    return _unsplit_plan(policy, tokens, cu_tokens, constraints, reason)


def as_token_counts(values, *, name: str, minimum: int) -> np.ndarray:
    """Per-request counts as a read-only int64 vector; the error names the first bad entry.

    The plan must not change when the caller later writes its array, so a
    writable (or borrowed) int64 array is copied; a read-only array that owns
    its data (e.g. another plan's ``token_counts``) is shared.
    """
    array = values if type(values) is np.ndarray else np.asarray(values)
    if array.ndim != 1 or not array.size:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {array.shape}")
    if array.dtype != INT64:
        if array.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integers within int64, got dtype {array.dtype}")
        if array.dtype.kind == "u" and array.max() > INT64_MAX:
            bad = int(np.flatnonzero(array > INT64_MAX)[0])
            raise ValueError(f"{name}[{bad}]={int(array[bad])} does not fit in int64")
        array = array.astype(INT64)
    elif array.flags.writeable or array.base is not None:
        array = array.copy()
    lowest = array.argmin()  # argmin + item: a fraction of a ufunc reduce's call cost
    if array.item(lowest) < minimum:
        bad = int(np.flatnonzero(array < minimum)[0])
        raise ValueError(f"{name}[{bad}]={int(array[bad])} is below the minimum {minimum}")
    array.setflags(write=False)
    return array


def matched_computed_counts(num_computed_tokens, tokens: np.ndarray) -> np.ndarray:
    """``num_computed_tokens`` as ``as_token_counts`` (minimum 0), one entry per request of
    ``tokens``; the error names both lengths."""
    computed = as_token_counts(num_computed_tokens, name="num_computed_tokens", minimum=0)
    if computed.shape != tokens.shape:
        raise ValueError(
            f"num_computed_tokens has {computed.size} entries but num_scheduled_tokens "
            f"has {tokens.size}"
        )
    return computed


def prefix_sums(tokens: np.ndarray, *, name: str) -> np.ndarray:
    """Read-only inclusive prefix sums; ValueError when the total does not fit in int64.

    Every count is >= 1, so the first wrap-around of the running sum is negative.
    """
    cu_tokens = np.add.accumulate(tokens)
    if cu_tokens.item(cu_tokens.argmin()) < 0:
        raise ValueError(
            f"{name} add up to {sum(tokens.tolist())} tokens, past the int64 limit {INT64_MAX}"
        )
    cu_tokens.setflags(write=False)
    return cu_tokens


def plan_vectorised(
    policy: SplitPolicy,
    num_scheduled_tokens,
    constraints: SplitConstraints,
    allow_fallback: bool,
    num_computed_tokens,
) -> SplitPlan:
    """``plan_split`` on numpy arrays (see there)."""
    tokens = as_token_counts(num_scheduled_tokens, name="num_scheduled_tokens", minimum=1)
    computed = None
    if num_computed_tokens is not None:
        computed = matched_computed_counts(num_computed_tokens, tokens)
    cu_tokens = prefix_sums(tokens, name="num_scheduled_tokens")
    if constraints.padded_total is not None:
        constraints.total_rows_for(cu_tokens.item(-1))  # ValueError when below round_up(T)
    selector = CUT_SELECTORS.get(policy)
    if selector is None:
        return _unsplit_plan(policy, tokens, cu_tokens, constraints, None)
    try:
        cut = selector(tokens, cu_tokens, constraints, computed)
        return _split_plan(policy, tokens, cu_tokens, constraints, cut)
    except SplitRejectedError as rejection:
        if not allow_fallback:
            raise
        reason = str(rejection)
    try:
        return _unsplit_plan(policy, tokens, cu_tokens, constraints, reason)
    except SplitRejectedError as impossible:
        raise fallback_impossible(reason, impossible) from None


def _piece_layout(pieces: np.ndarray, row_multiple: int) -> tuple[np.ndarray, int]:
    """Row start of each request piece and the rows they need under PCP padding."""
    piece_rows = -(-pieces // row_multiple) * row_multiple
    ends = piece_rows.cumsum()
    ends.setflags(write=False)
    starts = ends - piece_rows
    starts.setflags(write=False)
    return starts, int(ends[-1])


def _ubatch(
    index: int,
    token_start: int,
    token_stop: int,
    request_start: int,
    request_stop: int,
    pieces: np.ndarray | None,
    constraints: SplitConstraints,
    rows: int | None,
) -> UBatch:
    """Build one ubatch; ``rows=None`` takes the minimum its layout needs.

    Raises ``SplitRejectedError`` when ``rows`` cannot hold that layout.
    """
    align = constraints.align
    row_multiple = constraints.pcp_row_multiple
    piece_row_starts = None
    if row_multiple == 1:
        needed = -(-(token_stop - token_start) // align) * align
        pieces = None
    else:
        piece_row_starts, piece_rows = _piece_layout(pieces, row_multiple)
        needed = -(-piece_rows // align) * align
    return padded_ubatch(
        index,
        token_start,
        token_stop,
        request_start,
        request_stop,
        constraints,
        rows,
        needed,
        pieces,
        piece_row_starts,
    )


def _unsplit_plan(
    policy: SplitPolicy,
    tokens: np.ndarray,
    cu_tokens: np.ndarray,
    constraints: SplitConstraints,
    fallback_reason: str | None,
) -> SplitPlan:
    """The whole batch as one padded ubatch (padded_total rows when given)."""
    num_tokens = cu_tokens.item(-1)
    ubatch = _ubatch(
        0, 0, num_tokens, 0, tokens.size, tokens, constraints, constraints.padded_total
    )
    return built_plan(
        policy,
        tokens,
        constraints,
        None,
        (ubatch,),
        None,
        0,
        0,
        fallback_reason,
        cu_tokens=cu_tokens,
    )


def _split_plan(
    policy: SplitPolicy,
    tokens: np.ndarray,
    cu_tokens: np.ndarray,
    constraints: SplitConstraints,
    cut: int,
) -> SplitPlan:
    """Derive request slices, the boundary request and padding rows from a cut."""
    num_tokens = cu_tokens.item(-1)
    num_requests = tokens.size
    check_cut(cut, num_tokens)
    straddling = int(cu_tokens.searchsorted(cut + 1))  # first request ending after the cut
    sides = cut_sides(cut, straddling, cu_tokens.item(straddling), tokens.item(straddling))
    boundary, head_stop, head_tokens, tail_tokens = sides
    head_pieces = tail_pieces = None
    if constraints.pcp_size >= MIN_PCP_FOR_ZIGZAG:
        head_pieces = tokens[:head_stop].copy()
        tail_pieces = tokens[straddling:].copy()
        if boundary is not None:
            head_pieces[-1] = head_tokens
            tail_pieces[0] = tail_tokens
        head_pieces.setflags(write=False)
        tail_pieces.setflags(write=False)
    return cut_plan(
        policy, tokens, constraints, cut, num_tokens, num_requests, straddling, sides,
        head_pieces, tail_pieces, _ubatch, cu_tokens=cu_tokens,
    )
