"""Sequential repetitions: measure a comparison until it is decided, validly (issue 43).

A fixed protocol spends the same repetitions on every case, whether its answer
was clear after three runs or is still open after ten. Here each *comparison*
(a pair of cases: a policy pair, a chunk size against unchunked, an A/B pair)
keeps being measured until one of three things holds:

* ``excludes_threshold``: its interval excludes the decision threshold (a ratio
  of 1.0 by default): the two differ, in the direction the interval says;
* ``equivalent``: its interval lies inside the stated equivalence margin
  (``1/(1+m) .. 1+m`` on the ratio): the two are the same within ``m``;
* ``max_repetitions``: the most repetitions allowed were measured, undecided.

Why not a bootstrap interval re-checked after every run: each check is another
chance of a false call, and optional stopping makes the error rate grow with the
number of looks. The intervals here are **repeated confidence intervals of a
group-sequential design** (Jennison & Turnbull, *Group Sequential Methods*,
2000, ch. 9) with a Bonferroni alpha spending: at each planned look ``k`` (after
``n_k`` paired repetitions) the interval is the Student-t interval of the mean
paired log-ratio ``log(b_i / a_i)`` at level ``1 - alpha_k``, with
``sum_k alpha_k = alpha``. By the union bound, the probability that *any* look's
interval misses the true mean is at most ``alpha``, however the looks'
decisions depend on each other, so stopping at any look keeps the interval
valid: a confidence sequence over the planned looks.

Assumption (stated, and tested by simulation from recorded noise in
``benchmarks/sequential_sim_bench.py``): within a comparison the paired
log-ratios are independent and about normal. Looks are sparse (``3, 5, 8, 12,
16`` by default): each look costs alpha, so fewer looks give narrower intervals.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_afd.stats import student_t

STOP_THRESHOLD = "excludes_threshold"
STOP_EQUIVALENT = "equivalent"
STOP_MAX = "max_repetitions"
STOP_REASONS = (STOP_THRESHOLD, STOP_EQUIVALENT, STOP_MAX)
VERDICT_HIGHER = "higher"
"""The second case's metric is higher than the first's (for wall time: slower)."""
VERDICT_LOWER = "lower"
VERDICT_EQUIVALENT = "equivalent"
VERDICT_UNDECIDED = "undecided"

DEFAULT_ALPHA = 0.05
DEFAULT_MIN_REPETITIONS = 3
"""The RFC's minimum of measured repetitions: the first look."""
DEFAULT_MAX_REPETITIONS = 16
DEFAULT_EQUIVALENCE_MARGIN = 0.05
"""Two cases within 5% of each other are called the same (a 1.05x ratio either way)."""
DEFAULT_THRESHOLD_RATIO = 1.0
MIN_PAIRS = 2
"""A t interval needs a sample variance: at least two paired repetitions."""
LOOK_GROWTH = 1.5
"""Each planned look after the first measures about 1.5x the previous look's repetitions."""


@functools.lru_cache(maxsize=256)
def t_quantile(q: float, df: int) -> float:
    """Student-t quantile (cached: a session asks for the same few again and again)."""
    return student_t.t_quantile(q, df)


def planned_looks(min_repetitions: int, max_repetitions: int,
                  growth: float = LOOK_GROWTH) -> tuple[int, ...]:
    """The repetition counts at which intervals are checked: ``min``, then x``growth``
    (rounded up, at least +1), ending exactly at ``max``."""
    if min_repetitions < MIN_PAIRS:
        raise ValueError(f"min_repetitions={min_repetitions}: a t interval needs >= {MIN_PAIRS}")
    if max_repetitions < min_repetitions:
        raise ValueError(f"max_repetitions={max_repetitions} < min_repetitions={min_repetitions}")
    looks = [min_repetitions]
    while looks[-1] < max_repetitions:
        looks.append(min(max_repetitions, max(looks[-1] + 1, math.ceil(looks[-1] * growth))))
    return tuple(looks)


@dataclass(frozen=True)
class SequentialDesign:
    """The stopping rule of one comparison (all on the paired log-ratio ``log(b/a)``)."""

    alpha: float = DEFAULT_ALPHA
    min_repetitions: int = DEFAULT_MIN_REPETITIONS
    max_repetitions: int = DEFAULT_MAX_REPETITIONS
    equivalence_margin: float = DEFAULT_EQUIVALENCE_MARGIN
    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"SequentialDesign.alpha={self.alpha!r}: expected 0 < alpha < 1")
        if not self.equivalence_margin > 0:
            raise ValueError(f"SequentialDesign.equivalence_margin={self.equivalence_margin!r}: "
                             "expected > 0")
        if not self.threshold_ratio > 0:
            raise ValueError(f"SequentialDesign.threshold_ratio={self.threshold_ratio!r}: "
                             "expected > 0")
        planned_looks(self.min_repetitions, self.max_repetitions)  # validates the counts

    @property
    def looks(self) -> tuple[int, ...]:
        return planned_looks(self.min_repetitions, self.max_repetitions)

    @property
    def look_alpha(self) -> float:
        """Bonferroni spending: every planned look gets an equal share of ``alpha``."""
        return self.alpha / len(self.looks)

    def interval(self, log_ratios: Sequence[float]) -> tuple[float, float]:
        """The look's repeated confidence interval of the mean log-ratio."""
        n = len(log_ratios)
        if n < MIN_PAIRS:
            raise ValueError(f"an interval needs >= {MIN_PAIRS} paired repetitions, got {n}")
        mean = math.fsum(log_ratios) / n
        var = math.fsum((x - mean) ** 2 for x in log_ratios) / (n - 1)
        half = t_quantile(1 - self.look_alpha / 2, n - 1) * math.sqrt(var / n)
        return mean - half, mean + half

    def decide(self, log_ratios: Sequence[float]) -> Decision | None:
        """The decision at a planned look, or None (not a look, or keep measuring)."""
        n = len(log_ratios)
        if n not in self.looks:
            return None
        low, high = self.interval(log_ratios)
        threshold = math.log(self.threshold_ratio)
        margin = math.log1p(self.equivalence_margin)
        if low > threshold or high < threshold:
            verdict = VERDICT_HIGHER if low > threshold else VERDICT_LOWER
            return Decision(STOP_THRESHOLD, verdict, n, low, high)
        if -margin < low and high < margin:
            return Decision(STOP_EQUIVALENT, VERDICT_EQUIVALENT, n, low, high)
        if n >= self.max_repetitions:
            return Decision(STOP_MAX, VERDICT_UNDECIDED, n, low, high)
        return None

    def to_json(self) -> dict:
        return {"method": "group-sequential repeated t intervals on paired log-ratios, "
                          "Bonferroni alpha spending over the planned looks",
                "alpha": self.alpha, "min_repetitions": self.min_repetitions,
                "max_repetitions": self.max_repetitions, "looks": list(self.looks),
                "look_alpha": self.look_alpha, "equivalence_margin": self.equivalence_margin,
                "threshold_ratio": self.threshold_ratio}


@dataclass(frozen=True)
class Decision:
    """Why a comparison stopped, after how many paired repetitions, and its interval
    of ``b / a`` (the ratio, exponentiated from the log-ratio interval)."""

    reason: str
    verdict: str
    repetitions: int
    log_low: float
    log_high: float

    def to_json(self) -> dict:
        return {"stopped": self.reason, "verdict": self.verdict,
                "repetitions": self.repetitions,
                "ratio_interval": [math.exp(self.log_low), math.exp(self.log_high)]}


def paired_log_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """``log(b_i / a_i)`` for the repetitions measured in the same round."""
    n = min(len(a), len(b))
    for side, values in (("a", a), ("b", b)):
        bad = [v for v in values[:n] if not (v > 0 and math.isfinite(v))]
        if bad:
            raise ValueError(f"paired_log_ratios: case {side} has non-positive or non-finite "
                             f"repetitions {bad}")
    return [math.log(b[i] / a[i]) for i in range(n)]


def decide_sequence(design: SequentialDesign, log_ratios: Sequence[float]) -> Decision:
    """Replay a whole sequence look by look and return the first stop (tests, simulation)."""
    for look in design.looks:
        if look > len(log_ratios):
            break
        decision = design.decide(log_ratios[:look])
        if decision is not None:
            return decision
    raise ValueError(f"{len(log_ratios)} log-ratios reach no stop of {design.looks}")
