"""Repetition protocol and dispersion statistics for benchmark cases.

The RFC asks for at least three measured repetitions after a documented warmup,
reported with dispersion, and a fixed, interleaved or randomized run order with
the seed recorded. :func:`run_repeated` implements that protocol once so every
suite measures the same way; :func:`summarize` turns the repetitions into the
``stats`` object of ``schemas/result.schema.json``.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MIN_REPETITIONS = 3
RUN_ORDERS = ("fixed", "interleaved", "random")
# Name used when a measured callable returns a bare number instead of a mapping.
DEFAULT_METRIC = "value"
QUARTILES = (25.0, 75.0)


@dataclass(frozen=True)
class Stats:
    """Summary of one metric's repetitions (the schema's ``stats`` object)."""

    n: int
    median: float
    min: float
    max: float
    mean: float
    stddev: float
    iqr: float
    # stddev / mean; None when the mean is 0 (undefined).
    cv: float | None

    def to_json(self) -> dict:
        return {
            "n": self.n,
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "mean": self.mean,
            "stddev": self.stddev,
            "iqr": self.iqr,
            "cv": self.cv,
        }


def summarize(values: Sequence[float]) -> Stats:
    """Median, min, max, mean, sample stddev (n-1), IQR and CV of ``values``."""
    if len(values) == 0:
        raise ValueError("summarize() needs at least one value, got an empty sequence")
    data = [float(v) for v in values]
    for value in data:
        if not np.isfinite(value):
            raise ValueError(f"summarize() got a non-finite value {value!r} in {data!r}")
    mean = statistics.fmean(data)
    stddev = statistics.stdev(data) if len(data) > 1 else 0.0
    low, high = np.percentile(np.asarray(data), QUARTILES)
    return Stats(
        n=len(data),
        median=float(statistics.median(data)),
        min=min(data),
        max=max(data),
        mean=mean,
        stddev=stddev,
        iqr=float(high - low),
        cv=None if mean == 0 else stddev / abs(mean),
    )


def execution_order(
    case_names: Sequence[str], repetitions: int, run_order: str, seed: int
) -> list[tuple[str, int]]:
    """The (case, repetition index) sequence of the measured runs.

    ``fixed`` runs every repetition of a case before the next case;
    ``interleaved`` runs one repetition of each case per round; ``random``
    shuffles all (case, repetition) pairs with ``random.Random(seed)`` so the
    order is reproducible from the recorded seed.
    """
    if run_order not in RUN_ORDERS:
        raise ValueError(f"run_order={run_order!r}; expected one of {RUN_ORDERS}")
    if len(set(case_names)) != len(case_names):
        raise ValueError(f"case names must be unique, got {list(case_names)!r}")
    if run_order == "fixed":
        return [(name, rep) for name in case_names for rep in range(repetitions)]
    pairs = [(name, rep) for rep in range(repetitions) for name in case_names]
    if run_order == "random":
        random.Random(seed).shuffle(pairs)
    return pairs


@dataclass
class RepeatedRun:
    """Every measured value per case and metric, with the protocol that produced them."""

    repetitions: int
    warmups: int
    run_order: str
    seed: int
    executed_order: list[str]
    values: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    def stats(self, case: str, metric: str = DEFAULT_METRIC) -> Stats:
        return summarize(self.values[case][metric])

    def protocol_json(self) -> dict:
        """The result schema's ``protocol`` object."""
        return {
            "seed": self.seed,
            "warmups": self.warmups,
            "repetitions": self.repetitions,
            "run_order": self.run_order,
            "executed_order": list(self.executed_order),
        }


def _as_metrics(measured: float | Mapping[str, float], case: str) -> dict[str, float]:
    if isinstance(measured, Mapping):
        return {str(k): float(v) for k, v in measured.items()}
    if isinstance(measured, (int, float)):
        return {DEFAULT_METRIC: float(measured)}
    raise TypeError(
        f"case {case!r} returned {type(measured).__name__}; expected a number or a mapping of metric -> number"
    )


def run_repeated(
    cases: Mapping[str, Callable[[], float | Mapping[str, float]]],
    *,
    repetitions: int = MIN_REPETITIONS,
    warmups: int = 1,
    run_order: str = "interleaved",
    seed: int = 0,
    min_repetitions: int = MIN_REPETITIONS,
) -> RepeatedRun:
    """Warm up each case, then measure them in the chosen order.

    Each callable performs one run and returns a number or ``{metric: number}``.
    Warmup runs (``warmups`` per case, in case order, before any measured run)
    are discarded: they absorb first-call costs (allocation, caching). Cases
    compared in one table should be measured in one call so they share the
    order and the stack.
    """
    if repetitions < min_repetitions:
        raise ValueError(
            f"repetitions={repetitions}; the RFC requires at least {min_repetitions} measured repetitions"
        )
    if warmups < 0:
        raise ValueError(f"warmups={warmups}; expected >= 0")
    if not cases:
        raise ValueError("run_repeated() needs at least one case")
    names = list(cases)
    order = execution_order(names, repetitions, run_order, seed)
    for name in names:
        for _ in range(warmups):
            cases[name]()
    result = RepeatedRun(
        repetitions=repetitions,
        warmups=warmups,
        run_order=run_order,
        seed=seed,
        executed_order=[f"{name}#{rep}" for name, rep in order],
        values={name: {} for name in names},
    )
    for name, _rep in order:
        for metric, value in _as_metrics(cases[name](), name).items():
            result.values[name].setdefault(metric, []).append(value)
    return result


# ---- is a difference larger than the repetitions' noise? ---------------------------
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95


def iqr_bounds(values: Sequence[float]) -> tuple[float, float]:
    """(25th, 75th) percentile of ``values``."""
    low, high = np.percentile(np.asarray(values, dtype=np.float64), QUARTILES)
    return float(low), float(high)


def iqrs_overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether the interquartile ranges of two repetition sets overlap (then: no clear order)."""
    (a_low, a_high), (b_low, b_high) = iqr_bounds(a), iqr_bounds(b)
    return a_low <= b_high and b_low <= a_high


def bootstrap_interval(
    samples: Mapping[Any, Sequence[float]],
    statistic: Callable[[Mapping[Any, float]], float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``statistic`` over the repetitions of several cases.

    Each resample draws every case's repetitions with replacement and hands
    ``statistic`` the median per case; the interval is the central
    ``confidence`` share of the resampled statistic.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r}; expected 0 < confidence < 1")
    if resamples < 1:
        raise ValueError(f"resamples={resamples!r}; expected >= 1")
    rng = np.random.default_rng(seed)
    arrays = {key: np.asarray(values, dtype=np.float64) for key, values in samples.items()}
    for key, values in arrays.items():
        if values.size == 0 or not np.isfinite(values).all():
            raise ValueError(f"bootstrap_interval: case {key!r} has no finite repetitions")
    drawn = {key: rng.integers(0, values.size, (resamples, values.size))
             for key, values in arrays.items()}  # fmt: skip
    medians = {key: np.median(arrays[key][drawn[key]], axis=1) for key in arrays}
    values = [statistic({key: float(medians[key][i]) for key in arrays}) for i in range(resamples)]
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(np.asarray(values), (tail, 100 - tail))
    return float(low), float(high)
