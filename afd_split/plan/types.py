"""The plan's data types: ``SplitPlan`` and its ``UBatch`` es (pure data, no metadata arrays).

Both are frozen records (``afd_split.plan.frozen_record``): a plan is built on every
prefill step and, as frozen dataclasses, constructing its three objects was
more than half of a small batch's planning time. The planners build them with
``tuple.__new__`` and every field in order (``_ubatch_of`` / ``_plan_of``).
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property

import numpy as np

from afd_split.errors import SplitRejectedError
from afd_split.plan.constraints import MIN_PCP_FOR_ZIGZAG, SplitConstraints, SplitPolicy
from afd_split.plan.frozen_record import FrozenRecord

INT64 = np.dtype(np.int64)
INT64_MAX = int(np.iinfo(np.int64).max)

_tuple_new = tuple.__new__
_TOKEN_COUNTS_FIELD = 1  # SplitPlan's slot for token_counts (a tuple from the scalar planner)

UBATCH_FIELDS = (
    "index",
    "token_slice",
    "request_slice",
    "num_real_tokens",
    "num_padded_tokens",
    "piece_tokens",
    "piece_row_starts",
)
PLAN_FIELDS = (
    "policy",
    "token_counts",
    "constraints",
    "split_token",
    "ubatches",
    "boundary_request",
    "head_tokens",
    "tail_tokens",
    "fallback_reason",
)


class UBatch(
    FrozenRecord,
    fields=UBATCH_FIELDS,
    defaults={"piece_tokens": None, "piece_row_starts": None},
    hidden=("piece_tokens", "piece_row_starts"),
):
    """One ubatch: a contiguous token slice of the parent plus its own padding rows.

    Real tokens keep their logical order inside the ubatch's rows. Without PCP
    they occupy the first ``num_real_tokens`` rows and padding follows; with PCP
    each request piece starts at ``piece_row_starts[i]`` and is padded to a
    multiple of 2 * pcp (rows of the ubatch's global layout, before the zigzag
    hands 2 chunks of each piece to every PCP rank).
    """

    index: int
    token_slice: slice
    request_slice: slice
    num_real_tokens: int
    num_padded_tokens: int
    piece_tokens: np.ndarray | None
    piece_row_starts: np.ndarray | None

    @property
    def num_rows(self) -> int:
        """Rows this ubatch occupies: real tokens plus padding."""
        return self.num_real_tokens + self.num_padded_tokens

    @property
    def real_rows_are_prefix(self) -> bool:
        """True when real tokens are rows [0, num_real_tokens) (no per-request PCP padding)."""
        return self.piece_row_starts is None

    @cached_property
    def real_row_indices(self) -> np.ndarray:
        """Row of each real token inside this ubatch's padded rows (computed on first use)."""
        if self.piece_row_starts is None:
            rows = np.arange(self.num_real_tokens, dtype=np.int64)
        else:
            token_starts = np.cumsum(self.piece_tokens) - self.piece_tokens
            shift = np.repeat(self.piece_row_starts - token_starts, self.piece_tokens)
            rows = np.arange(self.num_real_tokens, dtype=np.int64) + shift
        rows.setflags(write=False)
        return rows

    def to_dict(self) -> dict:
        """Plain-integer description used by evidence, fingerprints and the CLI."""
        return {
            "index": self.index,
            "token_start": self.token_slice.start,
            "token_stop": self.token_slice.stop,
            "request_start": self.request_slice.start,
            "request_stop": self.request_slice.stop,
            "num_real_tokens": self.num_real_tokens,
            "num_padded_tokens": self.num_padded_tokens,
            "num_rows": self.num_rows,
        }


class SplitPlan(
    FrozenRecord,
    fields=PLAN_FIELDS,
    defaults={"fallback_reason": None},
    hidden=("token_counts",),
):
    """The outcome of ``plan_split``: one ubatch (unsplit) or two (split at ``split_token``).

    ``token_counts`` is stored as the planner had it: the vectorised planner's
    read-only int64 array, or the scalar planner's tuple of ints, turned into
    the array on first read (most per-step callers never read it).
    """

    policy: SplitPolicy
    constraints: SplitConstraints
    split_token: int | None
    ubatches: tuple[UBatch, ...]
    boundary_request: int | None
    head_tokens: int
    tail_tokens: int
    fallback_reason: str | None

    @cached_property
    def token_counts(self) -> np.ndarray:
        """Per-request scheduled tokens as a read-only int64 array."""
        counts = tuple.__getitem__(self, _TOKEN_COUNTS_FIELD)
        if type(counts) is np.ndarray:
            return counts
        array = np.array(counts, dtype=INT64)
        array.setflags(write=False)
        return array

    @cached_property
    def cu_tokens(self) -> np.ndarray:
        """Inclusive prefix sums of token_counts (read-only): query_start_loc[1:] of the batch."""
        cu_tokens = np.add.accumulate(self.token_counts)
        cu_tokens.setflags(write=False)
        return cu_tokens

    @cached_property
    def num_scheduled_tokens(self) -> tuple[int, ...]:
        """Per-request scheduled tokens as plain integers."""
        counts = tuple.__getitem__(self, _TOKEN_COUNTS_FIELD)
        if type(counts) is tuple:
            return counts
        return tuple(counts.tolist())

    @property
    def is_split(self) -> bool:
        """True when the batch runs as two ubatches."""
        return self.split_token is not None

    @property
    def num_tokens(self) -> int:
        """Real tokens T of the whole batch."""
        return self.ubatches[-1].token_slice.stop

    @property
    def num_requests(self) -> int:
        """Requests of the whole batch."""
        return self.ubatches[-1].request_slice.stop

    @property
    def num_rows(self) -> int:
        """Rows of all ubatches together (real plus padding)."""
        return sum(ubatch.num_rows for ubatch in self.ubatches)

    @property
    def imbalance(self) -> float | None:
        """|t0 - t1| / T over real tokens; None when not split."""
        if not self.is_split:
            return None
        head, tail = self.ubatches
        return abs(head.num_real_tokens - tail.num_real_tokens) / self.num_tokens

    def to_evidence(self) -> dict:
        """JSON-able record of the policy and the realized real/padded tokens per ubatch."""
        ubatches = [ubatch.to_dict() for ubatch in self.ubatches]
        rows = [ubatch.num_rows for ubatch in self.ubatches]
        return {
            "policy": self.policy.value,
            "split_token": self.split_token,
            "is_split": self.is_split,
            "num_requests": self.num_requests,
            "num_real_tokens": self.num_tokens,
            "num_padded_tokens": sum(ubatch.num_padded_tokens for ubatch in self.ubatches),
            "num_rows": sum(rows),
            "boundary_request": self.boundary_request,
            "head_tokens": self.head_tokens,
            "tail_tokens": self.tail_tokens,
            "fallback_reason": self.fallback_reason,
            "constraints": self.constraints.to_dict(),
            "ubatches": ubatches,
            "imbalance": self.imbalance,
            "row_imbalance": (abs(rows[0] - rows[1]) / sum(rows)) if self.is_split else None,
        }

    def fingerprint(self) -> str:
        """Stable SHA-256 over the inputs and the decision, compared across ranks."""
        decision = {
            "policy": self.policy.value,
            "constraints": self.constraints.to_dict(),
            "split_token": self.split_token,
            "boundary_request": self.boundary_request,
            "ubatches": [ubatch.to_dict() for ubatch in self.ubatches],
        }
        digest = hashlib.sha256(json.dumps(decision, sort_keys=True).encode())
        digest.update(np.ascontiguousarray(self.token_counts, dtype="<i8").tobytes())
        return digest.hexdigest()


def _built(cls, fields: dict):
    """Instance of a frozen dataclass from already-validated fields, skipping ``__init__``.

    The generated frozen ``__init__`` sets each field through
    ``object.__setattr__``; on the per-step planning path that is about half of
    the plan's construction time, so trusted internal builds fill ``__dict__``
    directly. Public construction still goes through ``__init__``.
    """
    instance = object.__new__(cls)
    instance.__dict__.update(fields)
    return instance


def fallback_impossible(reason: str, impossible: SplitRejectedError) -> SplitRejectedError:
    """The error of ``allow_fallback=True`` when the unsplit batch does not fit either."""
    return SplitRejectedError(
        f"cannot split this batch ({reason}) and the unsplit fallback does not fit either: "
        f"{impossible}"
    )


def ubatch_record(index, token_start, token_stop, request_start, request_stop, padding,
                  piece_tokens=None, piece_row_starts=None):
    """A ``UBatch`` of planner-checked values: tokens [start, stop), ``padding`` rows after."""
    return _tuple_new(
        UBatch,
        (
            index,
            slice(token_start, token_stop),
            slice(request_start, request_stop),
            token_stop - token_start,
            padding,
            piece_tokens,
            piece_row_starts,
        ),
    )


def plain_ubatch(index, token_start, token_stop, request_start, request_stop, align):
    """A ubatch without PCP or padded_total: its rows are its real tokens rounded up to align."""
    padding = -(token_stop - token_start) % align  # round_up(real, align) - real
    return ubatch_record(index, token_start, token_stop, request_start, request_stop, padding)


def check_cut(cut: int, num_tokens: int) -> None:
    """Reject a cut that leaves either ubatch empty (both planners, before any lookup)."""
    if not 0 < cut < num_tokens:
        raise SplitRejectedError(f"cut at token {cut} leaves an empty ubatch of {num_tokens}")


def cut_sides(cut: int, straddling: int, request_end: int, straddling_tokens: int):
    """``(boundary_request, head_stop, head_tokens, tail_tokens)`` of a cut inside (0, T).

    ``straddling`` is the first request ending after the cut, ``request_end`` its
    end token and ``straddling_tokens`` its scheduled tokens; a cut on a request
    boundary has no boundary request and no head / tail tokens.
    """
    head_tokens = cut - (request_end - straddling_tokens)
    if head_tokens == 0:
        return None, straddling, 0, 0
    return straddling, straddling + 1, head_tokens, request_end - cut


def cut_plan(policy, counts, constraints, cut, num_tokens, num_requests, straddling, sides,
             head_pieces, tail_pieces, ubatch, cu_tokens=None):
    """The ``SplitPlan`` of a cut: its head and tail ubatches, padded_total's extra rows
    going to the tail.

    ``sides`` is ``cut_sides``' result; ``ubatch`` is the planner's own builder (it
    lays the PCP pieces out on its representation: Python ints or numpy);
    ``head_pieces`` / ``tail_pieces`` are None without PCP.
    """
    boundary, head_stop, head_tokens, tail_tokens = sides
    padded_total = constraints.padded_total
    if padded_total is None and constraints.pcp_size < MIN_PCP_FOR_ZIGZAG:
        align = constraints.align
        head = plain_ubatch(0, 0, cut, 0, head_stop, align)
        tail = plain_ubatch(1, cut, num_tokens, straddling, num_requests, align)
    else:
        head = ubatch(0, 0, cut, 0, head_stop, head_pieces, constraints, None)
        tail_rows = None if padded_total is None else padded_total - head.num_rows
        tail = ubatch(
            1, cut, num_tokens, straddling, num_requests, tail_pieces, constraints, tail_rows
        )
    return built_plan(
        policy, counts, constraints, cut, (head, tail), boundary, head_tokens, tail_tokens, None,
        cu_tokens=cu_tokens,
    )


def padded_ubatch(
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
):
    """A ubatch of ``rows`` rows (``None``: the ``needed`` rows its layout takes).

    Both planners work out ``needed`` and the PCP pieces their own way (Python
    ints / numpy) and share this check: ``SplitRejectedError`` when ``rows``
    cannot hold the layout.
    """
    num_real = token_stop - token_start
    if rows is None:
        rows = needed
    elif rows < needed:
        raise SplitRejectedError(
            f"ubatch {index} would get {rows} rows (padded_total={constraints.padded_total}) "
            f"but its {num_real} tokens need {needed} rows under align={constraints.align}, "
            f"pcp_size={constraints.pcp_size}"
        )
    return ubatch_record(
        index,
        token_start,
        token_stop,
        request_start,
        request_stop,
        rows - num_real,
        piece_tokens,
        piece_row_starts,
    )


def built_plan(*fields, cu_tokens=None):
    """A ``SplitPlan`` from planner-checked ``fields``, in ``PLAN_FIELDS`` order.

    ``token_counts`` is the scalar planner's tuple of ints (the array is made on
    first read) or the vectorised planner's read-only array, which comes with
    its ``cu_tokens``.
    """
    plan = _tuple_new(SplitPlan, fields)
    if cu_tokens is not None:
        plan.__dict__["cu_tokens"] = cu_tokens  # cached_property's slot: already computed
    return plan
