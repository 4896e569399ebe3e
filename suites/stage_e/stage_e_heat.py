"""Stage E: per-layer expert heat and EP-rank skew from routed-token counts, and how the
straggler EP rank's load tracks the step's critical path."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def max_over_mean(counts: Sequence[int]) -> float | None:
    """Hottest entry / mean (1.0 = perfectly balanced); None for a layer that routed nothing."""
    values = np.asarray(counts, dtype=np.float64)
    mean = float(values.mean()) if values.size else 0.0
    return None if mean <= 0 else float(values.max() / mean)


def heat_summary(per_expert: Sequence[Sequence[int]], per_rank: Sequence[Sequence[int]]) -> dict:
    """Per MoE layer: expert heat and rank skew (max/mean, coefficient of variation), and the
    worst layer of each."""
    expert = [max_over_mean(layer) for layer in per_expert]
    rank = [max_over_mean(layer) for layer in per_rank]
    return {
        "per_layer_expert_max_over_mean": expert,
        "per_layer_rank_max_over_mean": rank,
        "per_layer_expert_cv": [coefficient_of_variation(layer) for layer in per_expert],
        "per_layer_rank_cv": [coefficient_of_variation(layer) for layer in per_rank],
        "worst_expert_max_over_mean": max((v for v in expert if v is not None), default=None),
        "worst_rank_max_over_mean": max((v for v in rank if v is not None), default=None),
    }


def coefficient_of_variation(counts: Sequence[int]) -> float | None:
    """Standard deviation / mean of one layer's loads; None for a layer that routed nothing."""
    values = np.asarray(counts, dtype=np.float64)
    mean = float(values.mean()) if values.size else 0.0
    return None if mean <= 0 else float(values.std() / mean)


STEP_TIME_FIELDS = (
    ("afd", "critical_path_s"),  # instrumented CPU AFD runs: the step's critical path
    ("profile", "critical_path_s"),  # profiled hardware runs (docs/profiling.md)
    ("plan_to_last_dispatch_s",),  # the AFD hook on hardware: planning to the last router
    ("wall_time_s",),  # the CPU backend's whole step
)
"""Per-step time a result's steps may carry, closest to the critical path first."""

MIN_CORRELATION_STEPS = 3


def _field(step: Mapping, path: tuple[str, ...]):
    for key in path:
        if not isinstance(step, Mapping) or key not in step:
            return None
        step = step[key]
    return step


def straggler_load(per_rank: Sequence[Sequence[int]]) -> int:
    """The hottest EP rank's routed tokens summed over the step's layers (the FFN side's
    critical path when every layer waits for its slowest rank)."""
    return int(sum(max(layer) for layer in per_rank if len(layer)))


def critical_path_correlation(steps: Sequence[Mapping]) -> dict:
    """Pearson r across steps between the straggler EP rank's load and the step's time.

    Uses the first of ``STEP_TIME_FIELDS`` that every step with per-rank load carries;
    the absent form (with its reason) when fewer than ``MIN_CORRELATION_STEPS`` steps have
    both, or either series is constant.
    """
    loaded = [s for s in steps if isinstance(s.get("expert_load_per_rank"), list)
              and s["expert_load_per_rank"]]
    for path in STEP_TIME_FIELDS:
        times = [_field(step, path) for step in loaded]
        if loaded and all(isinstance(t, int | float) for t in times):
            break
    else:
        return {"value": None, "absent_reason":
                f"no step time of {['.'.join(p) for p in STEP_TIME_FIELDS]} on the "
                f"{len(loaded)} steps with per-rank expert load"}
    loads = [straggler_load(step["expert_load_per_rank"]) for step in loaded]
    if len(loaded) < MIN_CORRELATION_STEPS or len(set(loads)) < 2 or len(set(times)) < 2:
        return {"value": None, "absent_reason":
                f"{len(loaded)} steps, {len(set(loads))} distinct straggler loads, "
                f"{len(set(times))} distinct times: too few to correlate"}
    return {
        "pearson_r": float(np.corrcoef(np.asarray(loads, float), np.asarray(times, float))[0, 1]),
        "steps": len(loaded),
        "time_field": ".".join(path),
        "straggler_routed_tokens": loads,
    }
