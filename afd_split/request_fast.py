"""Fast acceptance of the request-level check: the same conditions, fewer numpy calls.

``validate_split_requests`` runs every step. When every field is int64 of the
right shape, each of its array comparisons is equality of raw bytes, so the
parent's three fields are copied to bytes once and every part's slice is
compared as a bytes slice (no numpy slice object per comparison); scalar
conditions read ``.item``. ``requests_hold`` is the conjunction of exactly the
conditions ``afd_split.request_checks`` checks after the plan layout, so it
answers True only when those pass; when it answers False they run and name
the first violation.
"""

from __future__ import annotations

from itertools import accumulate

from afd_split.plan_scalar import SCALAR_PATH_MAX_REQUESTS
from afd_split.plan_types import INT64

WORD = INT64.itemsize
"""Bytes per int64 entry: request index i starts at byte WORD * i."""


def _int64_vectors(qsl, seq_lens, computed, num_reqs: int) -> bool:
    return (
        qsl.dtype == INT64
        and seq_lens.dtype == INT64
        and computed.dtype == INT64
        and qsl.shape == (num_reqs + 1,)
        and seq_lens.shape == (num_reqs,)
        and computed.shape == (num_reqs,)
    )


def _parent_holds(plan, qsl, seq_lens, computed) -> bool:
    """query_start_loc is 0, the plan's prefix sums, ends at its T; computed >= 0 and
    seq_len - query_len == computed for every request."""
    if qsl.item(0) != 0 or qsl.item(-1) != plan.ubatches[-1].token_slice.stop:
        return False
    if plan.num_requests <= SCALAR_PATH_MAX_REQUESTS:  # a scalar-path plan holds no arrays
        counts = plan.num_scheduled_tokens
        return (
            qsl[1:].tolist() == list(accumulate(counts))
            and min(computed.tolist()) >= 0
            and (seq_lens - computed).tolist() == list(counts)
        )
    return (
        qsl[1:].tobytes() == plan.cu_tokens.tobytes()
        and computed.item(computed.argmin()) >= 0
        and (seq_lens - computed).tobytes() == plan.token_counts.tobytes()
    )


def requests_hold(plan, qsl, seq_lens, computed, parts) -> bool:
    """True when every request-level condition of ``validate_split_requests`` holds
    (the plan's own layout is checked before, by the caller)."""
    num_reqs = plan.num_requests
    if not _int64_vectors(qsl, seq_lens, computed, num_reqs):
        return False
    if not _parent_holds(plan, qsl, seq_lens, computed):
        return False
    qsl_bytes, seq_bytes, computed_bytes = qsl.tobytes(), seq_lens.tobytes(), computed.tobytes()
    for ubatch, part in zip(plan.ubatches, parts, strict=True):
        req_start, req_stop = ubatch.request_slice.start, ubatch.request_slice.stop
        token_start, token_stop = ubatch.token_slice.start, ubatch.token_slice.stop
        part_qsl, part_seq, part_computed = (
            part.query_start_loc, part.seq_lens, part.num_computed_tokens
        )
        if not _int64_vectors(part_qsl, part_seq, part_computed, req_stop - req_start):
            return False
        last = part_qsl.item(-1)
        if part_qsl.item(0) != 0 or last != ubatch.num_real_tokens:
            return False
        interior = part_qsl[1:-1] + token_start if token_start else part_qsl[1:-1]
        if interior.tobytes() != qsl_bytes[WORD * (req_start + 1) : WORD * req_stop]:
            return False
        first_seq, last_seq = part_seq.item(0), part_seq.item(-1)
        first_computed, last_computed = part_computed.item(0), part_computed.item(-1)
        if (
            first_seq - part_qsl.item(1) != first_computed
            or last_seq - (last - part_qsl.item(-2)) != last_computed
            or first_computed != computed.item(req_start) + token_start - qsl.item(req_start)
            or last_seq != seq_lens.item(req_stop - 1) - (qsl.item(req_stop) - token_stop)
            or part_seq.tobytes()[:-WORD] != seq_bytes[WORD * req_start : WORD * (req_stop - 1)]
            or part_computed.tobytes()[WORD:]
            != computed_bytes[WORD * (req_start + 1) : WORD * req_stop]
        ):
            return False
    boundary = plan.boundary_request
    if boundary is None:
        return True
    head, tail = parts  # as the naming check: a forged one-ubatch plan fails to unpack
    return (
        tail.num_computed_tokens.item(0) == head.seq_lens.item(-1)
        and head.num_computed_tokens.item(-1) == computed.item(boundary)
    )


__all__ = ["requests_hold"]
