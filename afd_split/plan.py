"""Split plans: where the cut falls, which requests each ubatch holds, and its padding rows.

A plan is pure data derived from the per-request scheduled token counts; it
never touches metadata arrays, so every rank can compute (and cross-check) it
cheaply before any per-ubatch work starts.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

import numpy as np

from afd_split.constraints import MIN_PCP_FOR_ZIGZAG, SplitConstraints, SplitPolicy
from afd_split.errors import SplitRejectedError
from afd_split.policies import CUT_SELECTORS

DEFAULT_CONSTRAINTS = SplitConstraints()

INT64 = np.dtype(np.int64)

POLICY_BY_VALUE = MappingProxyType({policy.value: policy for policy in SplitPolicy})
"""Policy lookup by string without the cost of an Enum call on the per-step path."""


@dataclass(frozen=True, eq=False)
class UBatch:
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
    piece_tokens: np.ndarray | None = field(default=None, repr=False)
    piece_row_starts: np.ndarray | None = field(default=None, repr=False)

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


@dataclass(frozen=True, eq=False)
class SplitPlan:
    """The outcome of ``plan_split``: one ubatch (unsplit) or two (split at ``split_token``)."""

    policy: SplitPolicy
    token_counts: np.ndarray = field(repr=False)
    constraints: SplitConstraints
    split_token: int | None
    ubatches: tuple[UBatch, ...]
    boundary_request: int | None
    head_tokens: int
    tail_tokens: int
    fallback_reason: str | None = None

    @cached_property
    def cu_tokens(self) -> np.ndarray:
        """Inclusive prefix sums of token_counts (read-only): query_start_loc[1:] of the batch."""
        cu_tokens = np.add.accumulate(self.token_counts)
        cu_tokens.setflags(write=False)
        return cu_tokens

    @cached_property
    def num_scheduled_tokens(self) -> tuple[int, ...]:
        """Per-request scheduled tokens as plain integers."""
        return tuple(self.token_counts.tolist())

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


def as_token_counts(values, *, name: str, minimum: int) -> np.ndarray:
    """Per-request counts as a read-only int64 vector; the error names the first bad entry.

    An int64 ndarray (what a model runner holds) is wrapped in a read-only view,
    not copied, so planning stays O(1) numpy calls beyond the minimum check.
    """
    array = values if type(values) is np.ndarray else np.asarray(values)
    if array.ndim != 1 or not array.size:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {array.shape}")
    if array.dtype != INT64:
        if array.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integers, got dtype {array.dtype}")
        array = array.astype(np.int64)
    else:
        array = array.view()
    if np.minimum.reduce(array) < minimum:
        bad = int(np.flatnonzero(array < minimum)[0])
        raise ValueError(f"{name}[{bad}]={int(array[bad])} is below the minimum {minimum}")
    array.setflags(write=False)
    return array


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
    ``fallback_reason``. Invalid inputs raise ``ValueError`` naming the value.
    """
    policy = POLICY_BY_VALUE.get(policy) or SplitPolicy(policy)
    tokens = as_token_counts(num_scheduled_tokens, name="num_scheduled_tokens", minimum=1)
    computed = None
    if num_computed_tokens is not None:
        computed = as_token_counts(num_computed_tokens, name="num_computed_tokens", minimum=0)
        if computed.shape != tokens.shape:
            raise ValueError(
                f"num_computed_tokens has {computed.size} entries but num_scheduled_tokens "
                f"has {tokens.size}"
            )
    cu_tokens = np.add.accumulate(tokens)
    cu_tokens.setflags(write=False)
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
        return _unsplit_plan(policy, tokens, cu_tokens, constraints, str(rejection))


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
    num_real = token_stop - token_start
    align = constraints.align
    row_multiple = constraints.pcp_row_multiple
    piece_row_starts = None
    if row_multiple == 1:
        needed = -(-num_real // align) * align
        pieces = None
    else:
        piece_row_starts, piece_rows = _piece_layout(pieces, row_multiple)
        needed = -(-piece_rows // align) * align
    if rows is None:
        rows = needed
    elif rows < needed:
        raise SplitRejectedError(
            f"ubatch {index} would get {rows} rows (padded_total={constraints.padded_total}) "
            f"but its {num_real} tokens need {needed} rows under align={align}, "
            f"pcp_size={constraints.pcp_size}"
        )
    return _built(
        UBatch,
        {
            "index": index,
            "token_slice": slice(token_start, token_stop),
            "request_slice": slice(request_start, request_stop),
            "num_real_tokens": num_real,
            "num_padded_tokens": rows - num_real,
            "piece_tokens": pieces,
            "piece_row_starts": piece_row_starts,
        },
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
    return SplitPlan(
        policy=policy,
        token_counts=tokens,
        constraints=constraints,
        split_token=None,
        ubatches=(ubatch,),
        boundary_request=None,
        head_tokens=0,
        tail_tokens=0,
        fallback_reason=fallback_reason,
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
    if not 0 < cut < num_tokens:
        raise SplitRejectedError(f"cut at token {cut} leaves an empty ubatch of {num_tokens}")
    straddling = int(cu_tokens.searchsorted(cut + 1))  # first request ending after the cut
    request_end = cu_tokens.item(straddling)
    head_tokens = cut - (request_end - tokens.item(straddling))
    if head_tokens == 0:
        boundary, head_stop, tail_tokens = None, straddling, 0
    else:
        boundary, head_stop, tail_tokens = straddling, straddling + 1, request_end - cut
    head_pieces = tail_pieces = None
    if constraints.pcp_size >= MIN_PCP_FOR_ZIGZAG:
        head_pieces = tokens[:head_stop].copy()
        tail_pieces = tokens[straddling:].copy()
        if boundary is not None:
            head_pieces[-1] = head_tokens
            tail_pieces[0] = tail_tokens
    head = _ubatch(0, 0, cut, 0, head_stop, head_pieces, constraints, None)
    tail_rows = None
    if constraints.padded_total is not None:
        tail_rows = constraints.padded_total - head.num_rows
    tail = _ubatch(
        1, cut, num_tokens, straddling, num_requests, tail_pieces, constraints, tail_rows
    )
    return _built(
        SplitPlan,
        {
            "policy": policy,
            "token_counts": tokens,
            "constraints": constraints,
            "split_token": cut,
            "ubatches": (head, tail),
            "boundary_request": boundary,
            "head_tokens": head_tokens,
            "tail_tokens": tail_tokens,
            "fallback_reason": None,
            "cu_tokens": cu_tokens,
        },
    )
