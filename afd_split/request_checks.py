"""The per-step request-level check of a split: O(R), host-side, no token arrays.

Cheap enough for the engine hook to run every forward step: array equality is
one memcmp of the raw int64 bytes per field, every other check reads a few
scalars, and only a failing check pays for locating and naming the first bad
request. Every error starts with the name of the violated invariant (one of
``INVARIANTS``), then the ubatch and the request.
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np

from afd_split.errors import SplitInvariantError
from afd_split.plan import INT64, SplitPlan
from afd_split.plan_scalar import SCALAR_PATH_MAX_REQUESTS

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
"""Names that open every ``SplitInvariantError`` raised here."""


def _fail(invariant: str, detail: str):
    raise SplitInvariantError(f"{invariant}: {detail}")


def _fail_difference(invariant, where, name, mine, expected, offset: int = 0):
    """Name the first request where ``mine`` and ``expected`` differ (or the wrong dtype)."""
    if mine.dtype != INT64 or expected.dtype != INT64:
        _fail(
            invariant,
            f"{where}: {name} has dtype {mine.dtype}, expected int64 (reference {expected.dtype})",
        )
    index = int(np.flatnonzero(mine != expected)[0])
    _fail(
        invariant,
        f"{where} request {index + offset}: {name} {int(mine[index])} != expected "
        f"{int(expected[index])}",
    )


def _fail_shapes(where: str, fields, num_reqs: int):
    for name, shape in (
        ("query_start_loc", (num_reqs + 1,)),
        ("seq_lens", (num_reqs,)),
        ("num_computed_tokens", (num_reqs,)),
    ):
        actual = getattr(fields, name).shape
        if actual != shape:
            _fail(SHAPE, f"{where}: {name} has shape {actual}, expected {shape}")


def _check_plan_layout(plan: SplitPlan) -> None:
    """Ubatches tile [0, T) once over non-empty request slices that meet at the boundary
    request; padding rows are non-negative, aligned and add up to padded_total."""
    constraints = plan.constraints
    token_cursor = 0
    for ubatch in plan.ubatches:
        start, stop = ubatch.token_slice.start, ubatch.token_slice.stop
        if (
            start != token_cursor
            or stop <= start
            or stop - start != ubatch.num_real_tokens
            or ubatch.request_slice.stop <= ubatch.request_slice.start
        ):
            _fail(
                TOKEN_CONSERVATION,
                f"ubatch {ubatch.index}: tokens [{start}, {stop}) with "
                f"{ubatch.num_real_tokens} real tokens in requests {ubatch.request_slice} do "
                f"not continue at token {token_cursor}",
            )
        token_cursor = stop
        if ubatch.num_padded_tokens < 0 or ubatch.num_rows % constraints.align:
            _fail(
                PADDING_SEPARATION,
                f"ubatch {ubatch.index}: {ubatch.num_padded_tokens} padding rows, "
                f"{ubatch.num_rows} rows (align={constraints.align})",
            )
    if constraints.padded_total is not None and plan.num_rows != constraints.padded_total:
        _fail(
            PADDING_SEPARATION,
            f"ubatches hold {plan.num_rows} rows, padded_total={constraints.padded_total}",
        )
    if plan.split_token is not None:
        head, tail = plan.ubatches
        expected_start = head.request_slice.stop - (plan.boundary_request is not None)
        if head.request_slice.start or tail.request_slice.start != expected_start:
            _fail(
                BOUNDARY_CONTINUITY,
                f"request slices {head.request_slice}, {tail.request_slice} do not meet at "
                f"boundary request {plan.boundary_request}",
            )


def _check_parent(plan: SplitPlan, qsl, seq_lens, computed) -> None:
    """The parent is the batch the plan was made for and holds seq - query == computed."""
    num_reqs = plan.num_requests
    if (
        qsl.shape != (num_reqs + 1,)
        or seq_lens.shape != (num_reqs,)
        or computed.shape != (num_reqs,)
    ):
        _fail_shapes("parent", _Fields(qsl, seq_lens, computed), num_reqs)
    if qsl.item(0) != 0:
        _fail(QUERY_START_LOC, f"parent: query_start_loc[0]={qsl.item(0)}, expected 0")
    if qsl.item(-1) != plan.ubatches[-1].token_slice.stop:
        _fail(
            TOKEN_CONSERVATION,
            f"parent: query_start_loc[-1]={qsl.item(-1)} but the plan's ubatches hold "
            f"{plan.ubatches[-1].token_slice.stop} tokens",
        )
    if num_reqs <= SCALAR_PATH_MAX_REQUESTS:
        # Small batches compare as Python lists, so a scalar-path plan builds no array here.
        counts = plan.num_scheduled_tokens
        same_tokens = qsl[1:].tolist() == list(accumulate(counts))
        lowest = min(computed.tolist())
        same_computed = (seq_lens - computed).tolist() == list(counts)
    else:
        same_tokens = qsl[1:].tobytes() == plan.cu_tokens.tobytes()
        lowest = computed.item(computed.argmin())  # a fraction of a ufunc reduce's call cost
        # Used only once same_tokens holds (token_counts are then the parent's query lens).
        same_computed = (seq_lens - computed).tobytes() == plan.token_counts.tobytes()
    if not same_tokens:
        query_lens = qsl[1:] - qsl[:-1]
        index = int(np.flatnonzero(query_lens != plan.token_counts)[0])
        _fail(
            PLAN_MISMATCH,
            f"parent request {index}: query_len {int(query_lens[index])} but the plan was made "
            f"for {int(plan.token_counts[index])} tokens (a plan of another batch)",
        )
    if lowest < 0:
        index = int(np.flatnonzero(computed < 0)[0])
        _fail(COMPUTED_TOKENS, f"parent request {index}: num_computed_tokens {computed[index]} < 0")
    if not same_computed:
        _fail_difference(
            COMPUTED_TOKENS, "parent", "num_computed_tokens", computed, seq_lens - plan.token_counts
        )


class _Fields:
    """The three request-level arrays under their field names (for shape diagnostics)."""

    def __init__(self, query_start_loc, seq_lens, num_computed_tokens) -> None:
        self.query_start_loc = query_start_loc
        self.seq_lens = seq_lens
        self.num_computed_tokens = num_computed_tokens


def _check_part_tokens(ubatch, part, parent_qsl) -> None:
    """Shapes; query_start_loc is 0 .. real tokens and the parent's rebased in between;
    the two end requests (possibly pieces) hold seq_len - query_len == computed."""
    req_start, req_stop = ubatch.request_slice.start, ubatch.request_slice.stop
    num_reqs = req_stop - req_start
    qsl, seq_lens, computed = part.query_start_loc, part.seq_lens, part.num_computed_tokens
    if (
        qsl.shape != (num_reqs + 1,)
        or seq_lens.shape != (num_reqs,)
        or (computed.shape != (num_reqs,))
    ):
        _fail_shapes(f"ubatch {ubatch.index}", part, num_reqs)
    if qsl.item(0) != 0:
        _fail(QUERY_START_LOC, f"ubatch {ubatch.index}: query_start_loc[0]={qsl.item(0)}")
    last = qsl.item(-1)
    if last != ubatch.num_real_tokens:
        if ubatch.num_padded_tokens and last == ubatch.num_rows:
            _fail(
                PADDING_SEPARATION,
                f"ubatch {ubatch.index}: query_start_loc[-1]={last} counts its "
                f"{ubatch.num_padded_tokens} padding rows as real tokens "
                f"({ubatch.num_real_tokens} real)",
            )
        _fail(
            QUERY_START_LOC,
            f"ubatch {ubatch.index}: query_start_loc[-1]={last} != its "
            f"{ubatch.num_real_tokens} real tokens",
        )
    token_start = ubatch.token_slice.start
    interior = qsl[1:-1] + token_start if token_start else qsl[1:-1]
    expected = parent_qsl[req_start + 1 : req_stop]
    if interior.tobytes() != expected.tobytes():
        _fail_difference(
            QUERY_START_LOC,
            f"ubatch {ubatch.index}",
            "token_start + query_start_loc",
            interior,
            expected,
            1,
        )
    first_query, last_query = qsl.item(1), last - qsl.item(-2)
    for request, query_len in ((0, first_query), (num_reqs - 1, last_query)):
        if seq_lens.item(request) - query_len != computed.item(request):
            _fail(
                COMPUTED_TOKENS,
                f"ubatch {ubatch.index} request {request}: seq_len {seq_lens.item(request)} - "
                f"query_len {query_len} != num_computed_tokens {computed.item(request)}",
            )


def _check_boundary(plan: SplitPlan, parts, parent_computed) -> None:
    """The tail's piece of the boundary request continues exactly where the head's ends."""
    head, tail = parts
    boundary = plan.boundary_request
    head_seq, tail_computed = head.seq_lens.item(-1), tail.num_computed_tokens.item(0)
    if tail_computed != head_seq:
        _fail(
            BOUNDARY_CONTINUITY,
            f"boundary request {boundary}: tail num_computed_tokens {tail_computed} != head "
            f"seq_len {head_seq}",
        )
    head_computed = head.num_computed_tokens.item(-1)
    if head_computed != parent_computed.item(boundary):
        _fail(
            BOUNDARY_CONTINUITY,
            f"boundary request {boundary}: head num_computed_tokens {head_computed} != "
            f"parent's {parent_computed.item(boundary)}",
        )


def _check_part_against_parent(ubatch, part, parent_qsl, parent_seq, parent_computed) -> None:
    """Seq lens and computed tokens are the parent's, except the end pieces' adjustments."""
    req_start, req_stop = ubatch.request_slice.start, ubatch.request_slice.stop
    seq_lens, computed = part.seq_lens, part.num_computed_tokens
    already_done = ubatch.token_slice.start - parent_qsl.item(req_start)
    expected_first = parent_computed.item(req_start) + already_done
    if computed.item(0) != expected_first:
        _fail(
            COMPUTED_TOKENS,
            f"ubatch {ubatch.index} request 0: num_computed_tokens {computed.item(0)} != "
            f"parent's {expected_first - already_done} + {already_done} tokens run in "
            "earlier ubatches",
        )
    left_over = parent_qsl.item(req_stop) - ubatch.token_slice.stop
    expected_last = parent_seq.item(req_stop - 1) - left_over
    if seq_lens.item(-1) != expected_last:
        _fail(
            SEQ_LENS,
            f"ubatch {ubatch.index} request {req_stop - req_start - 1}: seq_len "
            f"{seq_lens.item(-1)} != parent's {expected_last + left_over} - {left_over} tokens "
            "left for the next ubatch",
        )
    # Everything between the two ends equals the parent's, whose invariant holds.
    mine, expected = seq_lens[:-1], parent_seq[req_start : req_stop - 1]
    if mine.tobytes() != expected.tobytes():
        _fail_difference(SEQ_LENS, f"ubatch {ubatch.index}", "seq_len", mine, expected)
    mine, expected = computed[1:], parent_computed[req_start + 1 : req_stop]
    if mine.tobytes() != expected.tobytes():
        _fail_difference(
            COMPUTED_TOKENS, f"ubatch {ubatch.index}", "num_computed_tokens", mine, expected, 1
        )


def validate_split_requests(plan: SplitPlan, parent, parts) -> None:
    """Check a split's request-level fields; raise ``SplitInvariantError`` naming the invariant.

    ``parent`` and ``parts`` carry int64 query_start_loc / seq_lens /
    num_computed_tokens (``RequestFields`` or ``BatchMetadata``). Checked, in
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
    ubatches = plan.ubatches
    if len(parts) != len(ubatches):
        _fail(SHAPE, f"{len(parts)} request-field parts for {len(ubatches)} ubatches")
    _check_plan_layout(plan)
    qsl, seq_lens, computed = parent.query_start_loc, parent.seq_lens, parent.num_computed_tokens
    _check_parent(plan, qsl, seq_lens, computed)
    for ubatch, part in zip(ubatches, parts, strict=True):
        _check_part_tokens(ubatch, part, qsl)
    if plan.boundary_request is not None:
        _check_boundary(plan, parts, computed)
    for ubatch, part in zip(ubatches, parts, strict=True):
        _check_part_against_parent(ubatch, part, qsl, seq_lens, computed)
