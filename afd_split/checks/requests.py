"""Request-level split fields (host-side, O(R), no token arrays) and their per-step check.

The engine hook holds ``query_start_loc_cpu``, ``seq_lens_cpu`` and
``num_computed_tokens_cpu`` on the host already; this module splits exactly
those, and ``validate_split_requests`` (``afd_split.checks.request_checks``) checks the
result cheaply enough to run every forward step. The token-level
``validate_split`` also reads slot_mapping / positions / block_table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from afd_split.checks.request_checks import INVARIANTS, validate_split_requests
from afd_split.plan.planner import INT64, SplitPlan, _built
from afd_split.plan.vector import as_token_counts, matched_computed_counts, prefix_sums

REQUEST_FIELD_NAMES = ("query_start_loc", "seq_lens", "num_computed_tokens")


def _owned_int64(name: str, value) -> np.ndarray:
    """A read-only int64 copy: the engine reuses its host buffers, so a view could change later."""
    array = np.asarray(value)
    if array.dtype.kind not in "iu" and array.size:
        raise ValueError(f"RequestFields.{name} must hold integers, got dtype {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"RequestFields.{name} must be 1-D, got shape {array.shape}")
    array = np.array(array, dtype=INT64)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class RequestFields:
    """Request-indexed fields of one batch or ubatch: query_start_loc [R+1], seq_lens [R],
    num_computed_tokens [R] (int64, read-only). Construction copies and normalises only;
    ``validate_split_requests`` checks the invariants."""

    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    num_computed_tokens: np.ndarray

    def __post_init__(self) -> None:
        for name in REQUEST_FIELD_NAMES:
            object.__setattr__(self, name, _owned_int64(name, getattr(self, name)))

    @classmethod
    def from_requests(cls, num_scheduled_tokens, num_computed_tokens=None) -> RequestFields:
        """Fields of a batch from its per-request counts: O(R), no per-token array."""
        tokens = as_token_counts(num_scheduled_tokens, name="num_scheduled_tokens", minimum=1)
        cu_tokens = prefix_sums(tokens, name="num_scheduled_tokens")
        if num_computed_tokens is None:
            computed = np.zeros_like(tokens)
        else:
            computed = matched_computed_counts(num_computed_tokens, tokens)
        seq_lens = computed + tokens
        if seq_lens.item(seq_lens.argmin()) < 0:  # a wrap-around past int64
            raise ValueError("num_computed_tokens + num_scheduled_tokens exceed int64")
        return cls(np.concatenate(([0], cu_tokens)), seq_lens, computed)

    @classmethod
    def of(cls, metadata) -> RequestFields:
        """The request-level fields of a ``BatchMetadata`` (or anything carrying the three)."""
        return cls(metadata.query_start_loc, metadata.seq_lens, metadata.num_computed_tokens)

    @property
    def num_reqs(self) -> int:
        """Requests R."""
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        """Real tokens: the last query_start_loc entry."""
        return self.query_start_loc.item(-1)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _check_placement(plan: SplitPlan, qsl: np.ndarray, num_reqs: int) -> None:
    """ValueError unless the parent's query_start_loc puts each ubatch's tokens in its requests."""
    if (
        num_reqs != plan.num_requests
        or qsl.shape != (num_reqs + 1,)
        or (qsl.item(-1) != plan.num_tokens)
    ):
        raise ValueError(
            f"metadata has {num_reqs} requests / {qsl.item(-1) if qsl.size else 0} tokens but "
            f"the plan was made for {plan.num_requests} / {plan.num_tokens}"
        )
    for ubatch in plan.ubatches:
        token_start, token_stop = ubatch.token_slice.start, ubatch.token_slice.stop
        req_start, req_stop = ubatch.request_slice.start, ubatch.request_slice.stop
        if not (
            qsl.item(req_start) <= token_start < qsl.item(req_start + 1)
            and qsl.item(req_stop - 1) < token_stop <= qsl.item(req_stop)
        ):
            raise ValueError(
                f"ubatch {ubatch.index}: metadata query_start_loc does not place tokens "
                f"{ubatch.token_slice} in requests {ubatch.request_slice}; the plan was made "
                "for a different batch"
            )


def cut_request_arrays(plan: SplitPlan, qsl, seq_lens, computed) -> list[tuple]:
    """Per ubatch ``(query_start_loc, seq_lens, num_computed_tokens, already_done, left_over)``.

    The arrays keep the inputs' dtype and are views of them except where an entry
    changes (then a fresh, writable copy): query_start_loc is clipped to the token
    slice and rebased; a first request that started in the previous ubatch gets
    ``num_computed_tokens += already_done`` (its seq_len stays the original); a
    last request cut by the slice ends ``left_over`` tokens early (computed + head).
    The caller has checked that ``qsl`` places the plan's tokens (``split_request_arrays``
    does, the engine adapters compare it with the plan's prefix sums).
    """
    parts = []
    for ubatch in plan.ubatches:
        token_start, token_stop = ubatch.token_slice.start, ubatch.token_slice.stop
        req_start, req_stop = ubatch.request_slice.start, ubatch.request_slice.stop
        already_done = token_start - qsl.item(req_start)
        left_over = qsl.item(req_stop) - token_stop
        local_qsl = qsl[req_start : req_stop + 1]
        if token_start or already_done or left_over:
            # qsl is sorted and the slice holds exactly the overlapping requests, so only its
            # two ends can fall outside [token_start, token_stop]: rebase, then pin the ends.
            local_qsl = local_qsl - token_start
            local_qsl[0] = 0
            local_qsl[-1] = token_stop - token_start
        part_computed = computed[req_start:req_stop]
        if already_done:
            part_computed = part_computed.copy()
            part_computed[0] += already_done
        part_seq_lens = seq_lens[req_start:req_stop]
        if left_over:
            part_seq_lens = part_seq_lens.copy()
            part_seq_lens[-1] -= left_over
        parts.append((local_qsl, part_seq_lens, part_computed, already_done, left_over))
    return parts


def split_request_arrays(plan: SplitPlan, qsl, seq_lens, computed) -> list[tuple]:
    """Per ubatch (query_start_loc, seq_lens, num_computed_tokens), read-only int64.

    ``cut_request_arrays`` once ``qsl`` is checked to place each ubatch's tokens in
    its requests (``ValueError`` otherwise). Untouched entries are views of the
    parent's (read-only) arrays.
    """
    _check_placement(plan, qsl, seq_lens.shape[0])
    return [
        (_frozen(local_qsl), _frozen(part_seq), _frozen(part_computed))
        for local_qsl, part_seq, part_computed, _, _ in cut_request_arrays(
            plan, qsl, seq_lens, computed
        )
    ]


def split_request_fields(plan: SplitPlan, parent) -> list[RequestFields]:
    """One ``RequestFields`` per ubatch of ``plan`` from the parent's request-level fields.

    ``parent`` is a ``RequestFields`` or a ``BatchMetadata``; no token-indexed
    array is read. Raises ``ValueError`` when the plan was made for another batch.
    """
    arrays = split_request_arrays(
        plan, parent.query_start_loc, parent.seq_lens, parent.num_computed_tokens
    )
    return [
        _built(
            RequestFields,
            {"query_start_loc": qsl, "seq_lens": seq_lens, "num_computed_tokens": computed},
        )
        for qsl, seq_lens, computed in arrays
    ]


__all__ = [
    "INVARIANTS",
    "RequestFields",
    "cut_request_arrays",
    "split_request_arrays",
    "split_request_fields",
    "validate_split_requests",
]
