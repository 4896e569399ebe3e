"""Locating and naming a request-level split violation: the slow path of the per-step check.

``afd_split.checks.request_checks`` decides pass/fail with a few memcmp-style
comparisons; only a failing split comes here, to find the first violated
invariant and name it, the ubatch and the request. Every error starts with
the invariant's name (one of ``INVARIANTS``). Arrays are compared by value, so
any integer dtype is diagnosed; a part whose dtype is not the parent's is
named as such.
"""

from __future__ import annotations

import numpy as np

from afd_split.errors import SplitInvariantError

SHAPE = "shape"
PLAN_MISMATCH = "plan mismatch"
QUERY_START_LOC = "query_start_loc"
SEQ_LENS = "seq_lens"
COMPUTED_TOKENS = "computed tokens"
BOUNDARY_CONTINUITY = "boundary continuity"
TOKEN_CONSERVATION = "token conservation"
PADDING_SEPARATION = "padding separation"
INVARIANTS = (
    SHAPE,
    PLAN_MISMATCH,
    QUERY_START_LOC,
    SEQ_LENS,
    COMPUTED_TOKENS,
    BOUNDARY_CONTINUITY,
    TOKEN_CONSERVATION,
    PADDING_SEPARATION,
)
"""Names that open every ``SplitInvariantError`` raised by the request-level check."""

FIELD_INVARIANTS = (
    ("query_start_loc", QUERY_START_LOC),
    ("seq_lens", SEQ_LENS),
    ("num_computed_tokens", COMPUTED_TOKENS),
)
"""The request-level fields in ``(query_start_loc, seq_lens, computed)`` order, each with
the invariant its errors are reported under."""


def fail(invariant: str, detail: str):
    raise SplitInvariantError(f"{invariant}: {detail}")


def _first(mask: np.ndarray) -> int | None:
    """Index of the first True entry of ``mask``, or None."""
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _fail_difference(invariant, where, name, mine, expected, offset: int = 0):
    """Name the first request where ``mine`` and ``expected`` differ."""
    index = _first(mine != expected)
    if index is not None:
        fail(
            invariant,
            f"{where} request {index + offset}: {name} {int(mine[index])} != expected "
            f"{int(expected[index])}",
        )


def _check_arrays(where: str, arrays, num_reqs: int, dtype) -> None:
    """Shapes ([R+1], [R], [R]); then every array in ``dtype`` (the parent's)."""
    shapes = ((num_reqs + 1,), (num_reqs,), (num_reqs,))
    for array, shape, (name, _) in zip(arrays, shapes, FIELD_INVARIANTS, strict=True):
        if array.shape != shape:
            fail(SHAPE, f"{where}: {name} has shape {array.shape}, expected {shape}")
    for array, (name, invariant) in zip(arrays, FIELD_INVARIANTS, strict=True):
        if array.dtype != dtype or array.dtype.kind not in "iu":
            fail(
                invariant, f"{where}: {name} has dtype {array.dtype}, expected the parent's {dtype}"
            )


def _diagnose_parent(plan, qsl, seq_lens, computed) -> None:
    """The parent is the batch the plan was made for and holds seq - query == computed."""
    num_reqs = plan.num_requests
    _check_arrays("parent", (qsl, seq_lens, computed), num_reqs, qsl.dtype)
    if qsl.item(0) != 0:
        fail(QUERY_START_LOC, f"parent: query_start_loc[0]={qsl.item(0)}, expected 0")
    if qsl.item(-1) != plan.num_tokens:
        fail(
            TOKEN_CONSERVATION,
            f"parent: query_start_loc[-1]={qsl.item(-1)} but the plan's ubatches hold "
            f"{plan.num_tokens} tokens",
        )
    counts = np.asarray(plan.num_scheduled_tokens, dtype=np.int64)
    query_lens = qsl[1:] - qsl[:-1]  # with query_start_loc[0] == 0: equal lens, equal sums
    index = _first(query_lens != counts)
    if index is not None:
        fail(
            PLAN_MISMATCH,
            f"parent request {index}: query_len {int(query_lens[index])} but the plan was made "
            f"for {int(counts[index])} tokens (a plan of another batch)",
        )
    index = _first(computed < 0)
    if index is not None:
        fail(
            COMPUTED_TOKENS,
            f"parent request {index}: num_computed_tokens {int(computed[index])} < 0",
        )
    _fail_difference(COMPUTED_TOKENS, "parent", "num_computed_tokens", computed, seq_lens - counts)


def _diagnose_part_tokens(ubatch, part, parent_qsl) -> None:
    """Shapes; query_start_loc is 0 .. real tokens and the parent's rebased in between;
    the two end requests (possibly pieces) hold seq_len - query_len == computed."""
    req_start, req_stop = ubatch.request_slice.start, ubatch.request_slice.stop
    num_reqs = req_stop - req_start
    where = f"ubatch {ubatch.index}"
    _check_arrays(where, part, num_reqs, parent_qsl.dtype)
    qsl, seq_lens, computed = part
    if qsl.item(0) != 0:
        fail(QUERY_START_LOC, f"{where}: query_start_loc[0]={qsl.item(0)}")
    last = qsl.item(-1)
    if last != ubatch.num_real_tokens:
        if ubatch.num_padded_tokens and last == ubatch.num_rows:
            fail(
                PADDING_SEPARATION,
                f"{where}: query_start_loc[-1]={last} counts its "
                f"{ubatch.num_padded_tokens} padding rows as real tokens "
                f"({ubatch.num_real_tokens} real)",
            )
        fail(
            QUERY_START_LOC,
            f"{where}: query_start_loc[-1]={last} != its {ubatch.num_real_tokens} real tokens",
        )
    interior = qsl[1:-1].astype(np.int64) + ubatch.token_slice.start
    expected = parent_qsl[req_start + 1 : req_stop]
    _fail_difference(QUERY_START_LOC, where, "token_start + query_start_loc", interior, expected, 1)
    first_query, last_query = qsl.item(1), last - qsl.item(-2)
    for request, query_len in ((0, first_query), (num_reqs - 1, last_query)):
        if seq_lens.item(request) - query_len != computed.item(request):
            fail(
                COMPUTED_TOKENS,
                f"{where} request {request}: seq_len {seq_lens.item(request)} - "
                f"query_len {query_len} != num_computed_tokens {computed.item(request)}",
            )


def _diagnose_boundary(plan, parts, parent_computed) -> None:
    """The tail's piece of the boundary request continues exactly where the head's ends."""
    (_, head_seq, head_computed), (_, _, tail_computed) = parts
    boundary = plan.boundary_request
    if tail_computed.item(0) != head_seq.item(-1):
        fail(
            BOUNDARY_CONTINUITY,
            f"boundary request {boundary}: tail num_computed_tokens {tail_computed.item(0)} != "
            f"head seq_len {head_seq.item(-1)}",
        )
    if head_computed.item(-1) != parent_computed.item(boundary):
        fail(
            BOUNDARY_CONTINUITY,
            f"boundary request {boundary}: head num_computed_tokens {head_computed.item(-1)} != "
            f"parent's {parent_computed.item(boundary)}",
        )


def _diagnose_part_against_parent(ubatch, part, parent_qsl, parent_seq, parent_computed) -> None:
    """Seq lens and computed tokens are the parent's, except the end pieces' adjustments."""
    req_start, req_stop = ubatch.request_slice.start, ubatch.request_slice.stop
    _, seq_lens, computed = part
    where = f"ubatch {ubatch.index}"
    already_done = ubatch.token_slice.start - parent_qsl.item(req_start)
    expected_first = parent_computed.item(req_start) + already_done
    if computed.item(0) != expected_first:
        fail(
            COMPUTED_TOKENS,
            f"{where} request 0: num_computed_tokens {computed.item(0)} != "
            f"parent's {expected_first - already_done} + {already_done} tokens run in "
            "earlier ubatches",
        )
    left_over = parent_qsl.item(req_stop) - ubatch.token_slice.stop
    expected_last = parent_seq.item(req_stop - 1) - left_over
    if seq_lens.item(-1) != expected_last:
        fail(
            SEQ_LENS,
            f"{where} request {req_stop - req_start - 1}: seq_len "
            f"{seq_lens.item(-1)} != parent's {expected_last + left_over} - {left_over} tokens "
            "left for the next ubatch",
        )
    # Everything between the two ends equals the parent's, whose invariant holds.
    _fail_difference(
        SEQ_LENS, where, "seq_len", seq_lens[:-1], parent_seq[req_start : req_stop - 1]
    )
    _fail_difference(
        COMPUTED_TOKENS,
        where,
        "num_computed_tokens",
        computed[1:],
        parent_computed[req_start + 1 : req_stop],
        1,
    )


def diagnose_split(plan, qsl, seq_lens, computed, parts) -> None:
    """Raise ``SplitInvariantError`` naming the first violated invariant of a failing split.

    ``parts`` are per-ubatch ``(query_start_loc, seq_lens, num_computed_tokens)``
    arrays. Order: the parent, then every ubatch's query_start_loc and end
    requests, the boundary piece, then seq lens / computed tokens against the
    parent. A split that reaches the end unnamed still fails (closed).
    """
    _diagnose_parent(plan, qsl, seq_lens, computed)
    for ubatch, part in zip(plan.ubatches, parts, strict=True):
        _diagnose_part_tokens(ubatch, part, qsl)
    if plan.boundary_request is not None:
        _diagnose_boundary(plan, parts, computed)
    for ubatch, part in zip(plan.ubatches, parts, strict=True):
        _diagnose_part_against_parent(ubatch, part, qsl, seq_lens, computed)
    fail(PLAN_MISMATCH, "the split's request fields fail the check at no single request")
