"""The per-step request-level check of a split: O(R), host-side, no token arrays.

Cheap enough for the engine hook to run every forward step: each array is
turned into bytes once and every "equals the parent's" comparison is a memcmp
of a byte range (no per-request Python loop, no temporary array but the
tail's rebased query_start_loc and the parent's query lens); the rest reads a
few scalars. Small batches (``LIST_CHECK_MAX_REQUESTS``) compare Python lists
instead, the same checks. Only a failing split pays for locating and naming the first bad
request (``afd_split.checks.diagnosis``). Every error starts with the name of
the violated invariant (one of ``INVARIANTS``), then the ubatch and the request.

Arrays may hold any integer dtype (the engine's host copies are int32), as
long as the parent's three arrays and every part's share it.
"""

from __future__ import annotations

from itertools import accumulate
from operator import sub

from afd_split.checks.diagnosis import (
    BOUNDARY_CONTINUITY,
    INVARIANTS,
    PADDING_SEPARATION,
    SHAPE,
    TOKEN_CONSERVATION,
    diagnose_split,
    fail,
)
from afd_split.plan.planner import INT64, SplitPlan

__all__ = ["INVARIANTS", "check_split_arrays", "validate_split_requests"]

LIST_CHECK_MAX_REQUESTS = 32
"""Up to this many requests the check compares Python lists (``tolist`` plus list
compares beat per-call numpy overhead); above it, byte ranges."""


def _check_plan_layout(plan: SplitPlan) -> None:
    """Ubatches tile [0, T) once over non-empty request slices that meet at the boundary
    request; padding rows are non-negative, aligned and add up to padded_total."""
    constraints = plan.constraints
    align = constraints.align
    token_cursor = rows = 0
    for ubatch in plan.ubatches:
        token_slice, request_slice = ubatch.token_slice, ubatch.request_slice
        start, stop = token_slice.start, token_slice.stop
        padding = ubatch.num_padded_tokens
        if (
            start != token_cursor
            or stop <= start
            or stop - start != ubatch.num_real_tokens
            or request_slice.stop <= request_slice.start
        ):
            fail(
                TOKEN_CONSERVATION,
                f"ubatch {ubatch.index}: tokens [{start}, {stop}) with "
                f"{ubatch.num_real_tokens} real tokens in requests {request_slice} do "
                f"not continue at token {token_cursor}",
            )
        token_cursor = stop
        if padding < 0 or (stop - start + padding) % align:
            fail(
                PADDING_SEPARATION,
                f"ubatch {ubatch.index}: {padding} padding rows, "
                f"{ubatch.num_rows} rows (align={align})",
            )
        rows += stop - start + padding
    if constraints.padded_total is not None and rows != constraints.padded_total:
        fail(
            PADDING_SEPARATION,
            f"ubatches hold {rows} rows, padded_total={constraints.padded_total}",
        )
    if plan.split_token is not None:
        head, tail = plan.ubatches
        expected_start = head.request_slice.stop - (plan.boundary_request is not None)
        if head.request_slice.start or tail.request_slice.start != expected_start:
            fail(
                BOUNDARY_CONTINUITY,
                f"request slices {head.request_slice}, {tail.request_slice} do not meet at "
                f"boundary request {plan.boundary_request}",
            )


def _fits(qsl, seq_lens, computed, num_reqs: int, dtype) -> bool:
    """[R+1], [R], [R] entries in ``dtype`` (ndim then len: cheaper than shape tuples)."""
    return not (
        qsl.ndim != 1
        or seq_lens.ndim != 1
        or computed.ndim != 1
        or len(qsl) != num_reqs + 1
        or len(seq_lens) != num_reqs
        or len(computed) != num_reqs
        or (qsl.dtype is not dtype and qsl.dtype != dtype)
        or (seq_lens.dtype is not dtype and seq_lens.dtype != dtype)
        or (computed.dtype is not dtype and computed.dtype != dtype)
    )


def _shapes_hold(plan: SplitPlan, qsl, seq_lens, computed, parts) -> bool:
    """Parent and parts: [R+1], [R], [R] entries of one integer dtype (the parent's)."""
    dtype = qsl.dtype
    if dtype.kind not in "iu" or not _fits(qsl, seq_lens, computed, plan.num_requests, dtype):
        return False
    for ubatch, (part_qsl, part_seq, part_computed) in zip(plan.ubatches, parts, strict=True):
        num_reqs = ubatch.request_slice.stop - ubatch.request_slice.start
        if not _fits(part_qsl, part_seq, part_computed, num_reqs, dtype):
            return False
    return True


def _values_hold_lists(plan: SplitPlan, qsl, seq_lens, computed, parts) -> bool:
    """``_values_hold`` on Python lists: for small batches, cheaper than any array call."""
    counts = plan.num_scheduled_tokens
    qsl, seq_lens, computed = qsl.tolist(), seq_lens.tolist(), computed.tolist()
    if (
        qsl[0] != 0
        or qsl[-1] != plan.num_tokens
        or min(computed) < 0
        or list(map(sub, seq_lens, computed)) != list(counts)
        or qsl[1:] != list(accumulate(counts))
    ):
        return False
    for ubatch, (part_qsl, part_seq, part_computed) in zip(plan.ubatches, parts, strict=True):
        start, stop = ubatch.request_slice.start, ubatch.request_slice.stop
        token_start, token_stop = ubatch.token_slice.start, ubatch.token_slice.stop
        part_qsl, part_seq = part_qsl.tolist(), part_seq.tolist()
        part_computed = part_computed.tolist()
        if (
            part_qsl[0] != 0
            or part_qsl[-1] != token_stop - token_start
            or part_computed[0] != computed[start] + token_start - qsl[start]
            or part_seq[-1] != seq_lens[stop - 1] - qsl[stop] + token_stop
            or part_seq[:-1] != seq_lens[start : stop - 1]
            or part_computed[1:] != computed[start + 1 : stop]
            or [entry + token_start for entry in part_qsl[1:-1]] != qsl[start + 1 : stop]
        ):
            return False
    return True


def _values_hold_bytes(plan: SplitPlan, qsl, seq_lens, computed, parts) -> bool:
    """``_values_hold`` with each array turned into bytes once, equal ranges one memcmp each."""
    if (
        qsl.item(0) != 0
        or qsl.item(-1) != plan.num_tokens
        or computed.item(computed.argmin()) < 0  # argmin: a fraction of a ufunc reduce's cost
    ):
        return False
    query_lens, cumulative = seq_lens - computed, qsl[1:]
    if qsl.dtype != INT64:
        query_lens, cumulative = query_lens.astype(INT64), cumulative.astype(INT64)
    if (
        query_lens.tobytes() != plan.token_counts.tobytes()
        or cumulative.tobytes() != plan.cu_tokens.tobytes()
    ):
        return False
    width = qsl.itemsize
    parent_qsl, parent_seq, parent_computed = qsl.tobytes(), seq_lens.tobytes(), computed.tobytes()
    for ubatch, (part_qsl, part_seq, part_computed) in zip(plan.ubatches, parts, strict=True):
        start, stop = ubatch.request_slice.start, ubatch.request_slice.stop
        token_start, token_stop = ubatch.token_slice.start, ubatch.token_slice.stop
        if (
            part_qsl.item(0) != 0
            or part_qsl.item(-1) != token_stop - token_start
            or part_computed.item(0) != computed.item(start) + token_start - qsl.item(start)
            or part_seq.item(-1) != seq_lens.item(stop - 1) - qsl.item(stop) + token_stop
        ):
            return False
        if token_start:
            interior = (part_qsl[1:-1] + token_start).tobytes()
        else:
            interior = part_qsl.tobytes()[width:-width]
        if (
            interior != parent_qsl[width * (start + 1) : width * stop]
            or part_seq.tobytes()[:-width] != parent_seq[width * start : width * (stop - 1)]
            or part_computed.tobytes()[width:]
            != parent_computed[width * (start + 1) : width * stop]
        ):
            return False
    return True


def _split_holds(plan: SplitPlan, qsl, seq_lens, computed, parts) -> bool:
    """The parent: query_start_loc is 0 then the plan's prefix sums and ends at the
    ubatches' last token, computed tokens are >= 0, seq_len - computed is the plan's
    query len. Every part (of the parent's dtype and shapes): query_start_loc runs 0 ..
    its real tokens and is the parent's rebased in between; its first computed count and
    last seq_len are the parent's adjusted by the tokens run before / left after it, the
    other entries the parent's.

    With the parent's invariant these give every part's: seq_len - query_len ==
    computed for each request, the end pieces included, and the tail's boundary
    piece starting at the head's seq_len (``diagnose_split`` names those by themselves).
    """
    if not _shapes_hold(plan, qsl, seq_lens, computed, parts):
        return False
    if plan.num_requests <= LIST_CHECK_MAX_REQUESTS:
        return _values_hold_lists(plan, qsl, seq_lens, computed, parts)
    return _values_hold_bytes(plan, qsl, seq_lens, computed, parts)


def check_split_arrays(plan: SplitPlan, qsl, seq_lens, computed, parts) -> None:
    """``validate_split_requests`` on bare arrays: the parent's query_start_loc / seq_lens /
    num_computed_tokens and per ubatch a ``(query_start_loc, seq_lens, computed)`` tuple,
    all of one integer dtype. Raises ``SplitInvariantError`` naming the invariant."""
    if len(parts) != len(plan.ubatches):
        fail(SHAPE, f"{len(parts)} request-field parts for {len(plan.ubatches)} ubatches")
    _check_plan_layout(plan)
    if not _split_holds(plan, qsl, seq_lens, computed, parts):
        diagnose_split(plan, qsl, seq_lens, computed, parts)


def validate_split_requests(plan: SplitPlan, parent, parts) -> None:
    """Check a split's request-level fields; raise ``SplitInvariantError`` naming the invariant.

    ``parent`` and ``parts`` carry query_start_loc / seq_lens / num_computed_tokens
    of one integer dtype (``RequestFields`` or ``BatchMetadata``). Checked, in
    this order: ubatches tile the tokens exactly once with aligned padding rows
    that add up to padded_total; the plan was made for the parent's per-request
    tokens; seq_len - query_len == num_computed_tokens for every parent request;
    every ubatch's query_start_loc starts at 0, ends at its real token count (not
    counting padding rows) and is the parent's rebased in between; its end
    requests hold the invariant; the tail's boundary piece starts at the head's
    seq_len; every other seq_len / computed count is the parent's (the head's
    boundary piece ends at computed + head tokens). Together these give the
    invariant for every request of every ubatch.
    """
    arrays = [(p.query_start_loc, p.seq_lens, p.num_computed_tokens) for p in parts]
    check_split_arrays(
        plan, parent.query_start_loc, parent.seq_lens, parent.num_computed_tokens, arrays
    )
