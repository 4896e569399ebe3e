"""Statistics of the AFD overlap benchmark: paired ratios, bootstrap intervals, noise floor, targets.

Pure functions over lists of seconds, so the benchmark's verdicts can be
checked without running a runtime. A *paired* ratio divides the two policies'
step times of the same round (they ran back to back, under the same load); its
median over rounds is the estimate, and a percentile bootstrap over rounds
gives its 95 % interval.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 4000
CONFIDENCE = 0.95
QUARTILES = 4


def dispersion(values: Sequence[float]) -> dict:
    """Median, extremes, IQR and IQR relative to the median of a sample."""
    ordered = sorted(values)
    if len(ordered) > 1:
        q1, _, q3 = statistics.quantiles(ordered, n=QUARTILES)
    else:
        q1 = q3 = ordered[0]
    median = statistics.median(ordered)
    return {
        "median": median,
        "min": ordered[0],
        "max": ordered[-1],
        "iqr": q3 - q1,
        "rel_iqr": (q3 - q1) / median if median else None,
        "n": len(ordered),
        "samples": ordered,
    }


def bootstrap_median_ci(
    values: Sequence[float], seed: int, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float]:
    """Percentile bootstrap interval (``CONFIDENCE``) of the median of ``values``."""
    sample = np.asarray(values, dtype=np.float64)
    if sample.size < 2:
        return float(sample[0]), float(sample[0])
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, sample.size, size=(resamples, sample.size))
    medians = np.median(sample[draws], axis=1)
    tail = (1.0 - CONFIDENCE) / 2.0
    low, high = np.quantile(medians, [tail, 1.0 - tail])
    return float(low), float(high)


def minimum_ratio_ci(
    numerator: Sequence[float], denominator: Sequence[float], seed: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> tuple[float, float]:
    """Percentile bootstrap interval of min(numerator) / min(denominator), rounds resampled."""
    top, bottom = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
    if top.size < 2:
        return float(top[0] / bottom[0]), float(top[0] / bottom[0])
    draws = np.random.default_rng(seed).integers(0, top.size, size=(resamples, top.size))
    ratios = top[draws].min(axis=1) / bottom[draws].min(axis=1)
    tail = (1.0 - CONFIDENCE) / 2.0
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float], seed: int) -> dict:
    """Per-round ratios of two policies' step times, their median and its bootstrap interval."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError(
            f"paired_ratio needs equally many rounds; got {len(numerator)} and {len(denominator)}"
        )
    ratios = [n / d for n, d in zip(numerator, denominator, strict=True)]
    low, high = bootstrap_median_ci(ratios, seed)
    return {
        "median": statistics.median(ratios),
        "ci95": [low, high],
        "ratio_of_medians": statistics.median(numerator) / statistics.median(denominator),
        "ratio_of_minimums": min(numerator) / min(denominator),
        # Secondary (not a target): each side's least-disturbed step of the whole run.
        "ratio_of_minimums_ci95": list(minimum_ratio_ci(numerator, denominator, seed)),
        "per_round": ratios,
    }


def round_record(steps: Sequence[dict]) -> dict:
    """One round of a case from its ``k`` back-to-back steps: the least-disturbed of them.

    Interference on a shared host only ever adds time (a rank loses its core,
    nothing makes the work faster), so the minimum of ``k`` steps estimates the
    step's own time; the round's other steps are kept. CPU seconds per rank are
    minima too (a busy sibling core and cache pollution inflate them as well);
    preemptions are the median.
    """
    if not steps:
        raise ValueError("round_record needs at least one step")
    ranks = list(steps[0]["cpu_time_s"])
    return {
        "step_time_s": min(s["step_time_s"] for s in steps),
        "step_times_s": [s["step_time_s"] for s in steps],
        "cpu_time_s": {rank: min(s["cpu_time_s"][rank] for s in steps) for rank in ranks},
        "involuntary_switches": {
            rank: statistics.median(s["involuntary_switches"][rank] for s in steps)
            for rank in ranks
        },
    }


def deviation_from_one(ratio: dict) -> float:
    """How far a ratio's median lands from 1.0 (the size of the difference it claims)."""
    return abs(ratio["median"] - 1.0)


def noise_floor(identical_pairs: Sequence[dict]) -> float | None:
    """Widest deviation from 1.0 that any pair of identical plans showed, interval included.

    Identical plans do the same work, so whatever separates them is the host's noise.
    """
    if not identical_pairs:
        return None
    return max(
        max(abs(pair["ci95"][0] - 1.0), abs(pair["ci95"][1] - 1.0)) for pair in identical_pairs
    )


def inside_noise(ratio: dict, floor: float | None) -> bool:
    """True when a ratio cannot be told from 1.0: its interval holds 1.0 or it is within the floor."""
    low, high = ratio["ci95"]
    if low <= 1.0 <= high:
        return True
    return floor is not None and deviation_from_one(ratio) <= floor


def ratio_target(name: str, ratio: dict | None, maximum: float, where: str) -> dict:
    """A ``ratio <= maximum`` target whose 95 % interval must also exclude 1.0."""
    if ratio is None:
        return {"name": name, "where": where, "value": None, "met": False,
                "why": "not measured in this run"}  # fmt: skip
    met = ratio["median"] <= maximum and ratio["ci95"][1] < 1.0
    return {
        "name": name,
        "where": where,
        "threshold": f"median <= {maximum} and the 95% interval excludes 1.0",
        "value": ratio["median"],
        "ci95": ratio["ci95"],
        "met": met,
    }


def identical_plans_target(pairs: dict[str, dict], tolerance: float) -> dict:
    """Every pair of identical plans within ``tolerance`` of each other (paired median)."""
    if not pairs:
        return {"name": "identical_plans_agree", "value": None, "met": False,
                "why": "no pair of identical plans was measured"}  # fmt: skip
    worst_name = max(pairs, key=lambda key: deviation_from_one(pairs[key]))
    worst = deviation_from_one(pairs[worst_name])
    return {
        "name": "identical_plans_agree",
        "threshold": f"|paired median - 1| <= {tolerance} for every pair of identical plans",
        "value": worst,
        "worst_pair": worst_name,
        "pairs": {key: pair["median"] for key, pair in pairs.items()},
        "met": worst <= tolerance,
    }


def load_target(load_before: Sequence[float], maximum: float) -> dict:
    """The host's 1-minute load before the benchmark started (its own ranks add up to ~2)."""
    value = float(load_before[0])
    return {
        "name": "host_load_below",
        "threshold": f"1-minute load average before the run < {maximum}",
        "value": value,
        "met": value < maximum,
    }
