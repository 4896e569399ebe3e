"""Cost model of the two-stage AFD prefill pipeline and the ``cost_balanced`` cut.

Token balance equalises the FFN side's work, but a prefill request's attention
cost grows with its query length times its context, so two token-equal ubatches
can differ a lot on the Attention side. This module models both sides per MoE
layer and picks the aligned cut that minimises the modelled two-stage critical
path (the makespan of the Attention/FFN pipeline over all MoE layers).

Model, per MoE layer and ubatch ``u`` with ``n_u`` rows and ``k_u`` attended keys
(the sum, over its query rows, of the keys each row attends to causally):

    attention_u = attention_fixed_s + attention_per_token_s * n_u + attention_per_key_s * k_u
    ffn_u       = expert_fixed_s + (expert_per_token_s + transfer_per_token_s) * n_u

Only ratios of the coefficients move the chosen cut, but the fixed terms do, so
the coefficients are calibrated from instrumented runs (``fit_cost_model``) and
recorded in the evidence with the plan. Pure numpy; no torch, no pytest.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from afd_split.plan.constraints import SplitConstraints
from afd_split.plan.policies.token_balanced import (
    select_token_balanced_cut,
    token_balanced_cut_range,
)

NUM_UBATCHES = 2
"""The pipeline this models has exactly two stages (the RFC's scope)."""

DEFAULT_NUM_MOE_LAYERS = 8
"""Pipeline depth assumed when the caller does not say (the reduced ten-layer model's MoE layers)."""

MIN_MODELLED_GAIN = 0.02
"""Leave token_balanced's cut only for a modelled makespan at least this much (relative) shorter.

Why: where the modelled makespan is flat (one role dominates), the argmin moves
on model error alone; measured runs then lose to the plain token-balanced cut.
"""


@dataclass(frozen=True)
class CostModel:
    """Per-MoE-layer cost coefficients of one Attention rank and one FFN rank (seconds)."""

    attention_per_token_s: float
    attention_per_key_s: float
    expert_per_token_s: float
    attention_fixed_s: float = 0.0
    expert_fixed_s: float = 0.0
    transfer_per_token_s: float = 0.0
    num_moe_layers: int = DEFAULT_NUM_MOE_LAYERS
    # Sparse attention (DSA) attends at most this many keys per query row; None = dense causal.
    key_cap: int | None = None
    source: str = "default"

    def __post_init__(self) -> None:
        coefficients = (
            ("attention_per_token_s", self.attention_per_token_s),
            ("attention_per_key_s", self.attention_per_key_s),
            ("expert_per_token_s", self.expert_per_token_s),
            ("attention_fixed_s", self.attention_fixed_s),
            ("expert_fixed_s", self.expert_fixed_s),
            ("transfer_per_token_s", self.transfer_per_token_s),
        )
        for name, value in coefficients:
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"CostModel.{name} must be a finite number >= 0, got {value!r}")
        if self.num_moe_layers < 1:
            raise ValueError(f"CostModel.num_moe_layers must be >= 1, got {self.num_moe_layers!r}")
        if self.key_cap is not None and self.key_cap < 1:
            raise ValueError(f"CostModel.key_cap must be None or >= 1, got {self.key_cap!r}")

    def to_evidence(self) -> dict:
        """JSON-able coefficients, recorded next to every plan this model chose."""
        return asdict(self)


DEFAULT_COST_MODEL = CostModel(
    # Calibrated with `python benchmarks/afd_overlap_bench.py --calibrate` on the reduced
    # model, 1 Attention + 1 FFN rank, one intra-op thread each, float32 (2-core CPU host).
    attention_per_token_s=1.0e-5,
    attention_per_key_s=2.0e-8,
    expert_per_token_s=3.0e-5,
    attention_fixed_s=2.0e-4,
    expert_fixed_s=2.0e-4,
    source="default: reduced-model CPU calibration",
)
"""Used when no calibrated model is in scope; see ``use_cost_model``."""

_ACTIVE_COST_MODEL: contextvars.ContextVar[CostModel] = contextvars.ContextVar(
    "afd_split_cost_model", default=DEFAULT_COST_MODEL
)


@contextlib.contextmanager
def use_cost_model(model: CostModel) -> Iterator[CostModel]:
    """Scope a calibrated model for ``plan_split(policy=COST_BALANCED)`` calls.

    Why a context variable: the policy seam passes only the batch and the
    constraints, and a cost model belongs to a deployment, not to one batch.
    """
    if not isinstance(model, CostModel):
        raise TypeError(f"use_cost_model expects a CostModel, got {type(model).__name__}")
    token = _ACTIVE_COST_MODEL.set(model)
    try:
        yield model
    finally:
        _ACTIVE_COST_MODEL.reset(token)


def active_cost_model() -> CostModel:
    """The model ``cost_balanced`` uses right now (the scoped one, else the default)."""
    return _ACTIVE_COST_MODEL.get()


def attended_keys_per_row(
    scheduled_tokens: np.ndarray, num_computed_tokens: np.ndarray | None, key_cap: int | None
) -> np.ndarray:
    """Keys each query row attends to: its absolute position + 1 (capped under sparse attention).

    Splitting a request does not change these counts (the tail reads the head's
    KV), which is why a cut's key total is a prefix sum over rows.
    """
    scheduled = np.asarray(scheduled_tokens, dtype=np.int64)
    computed = (
        np.zeros_like(scheduled)
        if num_computed_tokens is None
        else np.asarray(num_computed_tokens, dtype=np.int64)
    )
    if computed.shape != scheduled.shape:
        raise ValueError(
            f"num_computed_tokens has shape {computed.shape}, expected {scheduled.shape} "
            "(one count per request)"
        )
    starts = np.repeat(np.cumsum(scheduled) - scheduled, scheduled)
    offset_in_request = np.arange(int(scheduled.sum()), dtype=np.int64) - starts
    keys = np.repeat(computed, scheduled) + offset_in_request + 1
    if key_cap is not None:
        keys = np.minimum(keys, key_cap)
    return keys


def ubatch_stage_costs(
    model: CostModel,
    cuts: np.ndarray,
    cumulative_keys: np.ndarray,
    total_rows: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Modelled (attention_0, attention_1, ffn_0, ffn_1) per candidate cut.

    ``cumulative_keys[s]`` is the key total of rows [0, s); padding rows
    (``total_rows - T``) ride in the tail and cost per token but attend nothing.
    """
    num_tokens = len(cumulative_keys) - 1
    cuts = np.asarray(cuts, dtype=np.int64)
    head_keys = cumulative_keys[cuts].astype(np.float64)
    tail_keys = float(cumulative_keys[num_tokens]) - head_keys
    head_rows = cuts.astype(np.float64)
    tail_rows = float(total_rows) - head_rows

    def attention(rows: np.ndarray, keys: np.ndarray) -> np.ndarray:
        return (
            model.attention_fixed_s
            + model.attention_per_token_s * rows
            + model.attention_per_key_s * keys
        )

    def ffn(rows: np.ndarray) -> np.ndarray:
        per_token = model.expert_per_token_s + model.transfer_per_token_s
        return model.expert_fixed_s + per_token * rows

    return (
        attention(head_rows, head_keys),
        attention(tail_rows, tail_keys),
        ffn(head_rows),
        ffn(tail_rows),
    )


def two_stage_makespan(
    attention_costs: Sequence[np.ndarray], ffn_costs: Sequence[np.ndarray], num_layers: int
) -> np.ndarray:
    """Makespan of the Attention/FFN pipeline over ``num_layers`` MoE layers (vectorised).

    The schedule the AFD runtime executes: the Attention rank runs ubatch 0 then
    ubatch 1 of each layer, and ubatch u of layer l + 1 needs ubatch u's expert
    output of layer l; the FFN rank serves ubatches in arrival order. With one
    ubatch this degenerates to the serial sum (no overlap).
    """
    num_stages = len(attention_costs)
    if num_stages != len(ffn_costs):
        raise ValueError(
            f"{num_stages} attention costs but {len(ffn_costs)} ffn costs; one of each per ubatch"
        )
    shape = np.broadcast(*attention_costs, *ffn_costs).shape
    attention_free = np.zeros(shape)
    ffn_free = np.zeros(shape)
    expert_done = [np.zeros(shape) for _ in range(num_stages)]
    for _ in range(num_layers):
        for stage in range(num_stages):
            attention_end = np.maximum(attention_free, expert_done[stage]) + attention_costs[stage]
            attention_free = attention_end
            ffn_free = np.maximum(ffn_free, attention_end) + ffn_costs[stage]
            expert_done[stage] = ffn_free
    return np.maximum.reduce([attention_free, *expert_done])


def modelled_plan_cost(
    model: CostModel,
    scheduled_tokens: np.ndarray,
    num_computed_tokens: np.ndarray | None,
    cut: int | None,
    total_rows: int | None = None,
) -> dict:
    """Modelled per-ubatch stage costs and makespan of one cut (None: unsplit), for evidence."""
    keys = attended_keys_per_row(scheduled_tokens, num_computed_tokens, model.key_cap)
    cumulative = np.concatenate(([0], np.cumsum(keys)))
    num_tokens = len(keys)
    rows = num_tokens if total_rows is None else total_rows
    if cut is None:
        # One ubatch holds every row (padding included) and attends every key.
        a0, _, f0, _ = ubatch_stage_costs(model, np.array([num_tokens]), cumulative, num_tokens)
        padding = rows - num_tokens
        attention_costs = [a0 + model.attention_per_token_s * padding]
        ffn_costs = [f0 + (model.expert_per_token_s + model.transfer_per_token_s) * padding]
    else:
        a0, a1, f0, f1 = ubatch_stage_costs(model, np.array([cut]), cumulative, rows)
        attention_costs, ffn_costs = [a0, a1], [f0, f1]
    makespan = two_stage_makespan(attention_costs, ffn_costs, model.num_moe_layers)
    return {
        "cut": cut,
        "attention_s": [float(a[0]) for a in attention_costs],
        "ffn_s": [float(f[0]) for f in ffn_costs],
        "makespan_s": float(makespan[0]),
    }


def select_cost_balanced_cut(
    scheduled_tokens: np.ndarray,
    cu_tokens: np.ndarray,
    constraints: SplitConstraints,
    num_computed_tokens: np.ndarray | None,
) -> int:
    """Aligned cut minimising the modelled two-stage makespan; ties go to the larger cut.

    Candidates are the cuts token_balanced may choose from (multiples of align
    leaving min_ubatch_tokens on each side), so this policy differs from
    token_balanced only in where inside that range it cuts, and only when the
    model predicts a gain of at least ``MIN_MODELLED_GAIN``.
    """
    model = active_cost_model()
    num_tokens = int(cu_tokens[-1])
    align = constraints.align
    lowest, highest = token_balanced_cut_range(num_tokens, constraints, policy="cost_balanced")
    keys = attended_keys_per_row(scheduled_tokens, num_computed_tokens, model.key_cap)
    cumulative = np.concatenate(([0], np.cumsum(keys)))
    cuts = np.arange(lowest, highest + 1, align, dtype=np.int64)
    total_rows = constraints.total_rows_for(num_tokens)
    a0, a1, f0, f1 = ubatch_stage_costs(model, cuts, cumulative, total_rows)
    makespan = two_stage_makespan([a0, a1], [f0, f1], model.num_moe_layers)
    # Last index of the minimum: the tail carries padding and the boundary's KV read.
    best = len(cuts) - 1 - int(np.argmin(makespan[::-1]))
    balanced_cut = select_token_balanced_cut(scheduled_tokens, cu_tokens, constraints, None)
    balanced = int((balanced_cut - lowest) // align)
    if makespan[best] > makespan[balanced] * (1.0 - MIN_MODELLED_GAIN):
        return balanced_cut
    return int(cuts[best])


@dataclass(frozen=True)
class StageSample:
    """One measured (layer, ubatch) pair from an instrumented AFD run."""

    num_rows: int
    num_keys: int
    attention_s: float
    expert_s: float
    transfer_s: float = 0.0


def _nonnegative_least_squares(design: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Least squares with negative coefficients dropped and the rest refitted (tiny NNLS).

    Why not plain lstsq: a collinear or noisy column can come out negative, and
    a negative per-token cost would let the optimiser prefer absurd cuts.
    """
    active = np.ones(design.shape[1], dtype=bool)
    coefficients = np.zeros(design.shape[1])
    for _ in range(design.shape[1]):
        solution, *_ = np.linalg.lstsq(design[:, active], target, rcond=None)
        coefficients[:] = 0.0
        coefficients[active] = solution
        if (solution >= 0).all():
            return coefficients
        active[np.flatnonzero(active)[solution < 0]] = False
    return np.clip(coefficients, 0.0, None)


def fit_cost_model(
    samples: Sequence[StageSample],
    *,
    num_moe_layers: int,
    key_cap: int | None = None,
    source: str = "calibrated",
) -> CostModel:
    """Fit the coefficients to measured per-layer, per-ubatch stage times."""
    min_samples = 3
    if len(samples) < min_samples:
        raise ValueError(
            f"fit_cost_model needs >= {min_samples} samples to fit three coefficients, "
            f"got {len(samples)}"
        )
    rows = np.array([s.num_rows for s in samples], dtype=np.float64)
    keys = np.array([s.num_keys for s in samples], dtype=np.float64)
    ones = np.ones_like(rows)
    attention = _nonnegative_least_squares(
        np.stack([ones, rows, keys], axis=1), np.array([s.attention_s for s in samples])
    )
    expert = _nonnegative_least_squares(
        np.stack([ones, rows], axis=1), np.array([s.expert_s for s in samples])
    )
    transfer = _nonnegative_least_squares(rows[:, None], np.array([s.transfer_s for s in samples]))
    return CostModel(
        attention_fixed_s=float(attention[0]),
        attention_per_token_s=float(attention[1]),
        attention_per_key_s=float(attention[2]),
        expert_fixed_s=float(expert[0]),
        expert_per_token_s=float(expert[1]),
        transfer_per_token_s=float(transfer[0]),
        num_moe_layers=num_moe_layers,
        key_cap=key_cap,
        source=source,
    )


def with_layers(model: CostModel, num_moe_layers: int) -> CostModel:
    """The same coefficients for a model of a different depth."""
    return replace(model, num_moe_layers=num_moe_layers)
