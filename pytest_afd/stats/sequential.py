"""Sequential repetitions: measure a comparison until it is decided, validly (issue 43).

A fixed protocol spends the same repetitions on every case, whether its answer
was clear after three runs or is still open after ten. Here each *comparison*
(a pair of cases: a policy pair, a chunk size against unchunked, an A/B pair)
keeps being measured until one of three things holds:

* ``excludes_threshold``: its interval excludes the decision threshold (a ratio
  of 1.0 by default): the two differ, in the direction the interval says;
* ``equivalent``: its equivalence bounds lie inside the stated margin
  (``1/(1+m) .. 1+m`` on the ratio): the two are the same within ``m`` (a real
  difference smaller than the margin is not resolved: fixed repetitions are for that);
* ``max_repetitions``: the most repetitions allowed were measured, undecided.

Why not a bootstrap interval re-checked after every run: each check is another
chance of a false call, and optional stopping makes the error rate grow with the
number of looks. The intervals here are **repeated confidence intervals of a
group-sequential design** (Jennison & Turnbull, *Group Sequential Methods*, 2000,
ch. 2 and 9): at each planned look (after ``n`` paired repetitions) the Student-t
interval of the mean paired log-ratio ``log(b_i / a_i)`` at one nominal level ``a``
for every look (a Pocock-type boundary), where ``a`` is calibrated so that the chance
that *any* look's interval misses the true mean is ``alpha``
(:mod:`pytest_afd.stats.sequential_bounds`: exact for normal data, because the
studentized paths do not depend on the mean or the sd). Stopping at any look
therefore keeps the interval valid: a confidence sequence over the planned looks.

Stopping for equivalence (futility) uses a second family of the same kind, one-sided
at ``futility_level`` (10%): stop ``equivalent`` when both its bounds lie inside the
margin, so "no change as large as the margin" is wrong at most 10% of the time,
the type-II rate a 90%-power fixed protocol accepts when it leaves a case
undecided. The equivalence stop is non-binding: it only ends measuring earlier, so
it cannot raise the false-call rate. The default margin is the smallest change the
protocol is powered for (1.2x): within 5% could not be shown in 16 repetitions at
the harness's noise (``benchmarks/sequential_sim_bench.py``).

``spending="bonferroni"`` keeps the earlier rule (``alpha / K`` per look, the
efficacy interval also deciding equivalence, looks x1.5): valid by the union bound
but conservative; the benchmark reports both.

Assumption (stated, and tested by simulation from recorded noise in
``benchmarks/sequential_sim_bench.py``): within a comparison the paired
log-ratios are independent and about normal. Looks are at every repetition from
the first look on (``3..16`` by default): with the exact calibration more looks
cost little (the looks are strongly dependent) and let a clear comparison stop
as soon as it is clear.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_afd.stats import student_t
from pytest_afd.stats.sequential_bounds import calibrated_look_level

STOP_THRESHOLD = "excludes_threshold"
STOP_EQUIVALENT = "equivalent"
STOP_MAX = "max_repetitions"
STOP_REASONS = (STOP_THRESHOLD, STOP_EQUIVALENT, STOP_MAX)
VERDICT_HIGHER = "higher"
"""The second case's metric is higher than the first's (for wall time: slower)."""
VERDICT_LOWER = "lower"
VERDICT_EQUIVALENT = "equivalent"
VERDICT_UNDECIDED = "undecided"

DEFAULT_ALPHA = 0.045
"""The 5% false-call target less half a point: the calibrated rule spends its alpha
exactly for normal noise, and the recorded wall-time noise has heavier tails (a fixed
t-test at 5% makes 5.1% false calls on it; the rule at 5%, 4.6-5.1% over 10,000
simulated sessions), so a rule at 5% would sit on the target, not under it."""
BONFERRONI_ALPHA = 0.05
"""The earlier rule's alpha (its union bound left it conservative: 2.8% A/A)."""
DEFAULT_MIN_REPETITIONS = 3
"""The RFC's minimum of measured repetitions: the first look."""
DEFAULT_MAX_REPETITIONS = 16
DEFAULT_EQUIVALENCE_MARGIN = 0.2
"""Two cases within 1.2x of each other are called the same: the smallest change the
protocol is powered to find (``benchmarks/sequential_sim_bench.py``'s planted 1.2x)."""
DEFAULT_FUTILITY_LEVEL = 0.10
"""One-sided error of an ``equivalent`` stop: a real change of the margin's size is
called equivalent at most 10% of the time."""
MAX_ONE_SIDED = 0.5
"""A one-sided level at or above 0.5 would accept a bound on the wrong side of the mean."""
SPENDING_CALIBRATED = "calibrated"
SPENDING_BONFERRONI = "bonferroni"
SPENDINGS = (SPENDING_CALIBRATED, SPENDING_BONFERRONI)
DEFAULT_THRESHOLD_RATIO = 1.0
MIN_PAIRS = 2
"""A t interval needs a sample variance: at least two paired repetitions."""
LOOK_GROWTH = 1.0
"""A look after every repetition from the first look on (growth 1: +1 each) ..."""
DENSE_LOOKS_UNTIL = 16
"""... up to the default maximum; past it (``--afd-max-repeats`` may be up to 1000) the
looks grow x1.2, so the calibration simulates tens of looks, not hundreds."""
LATE_LOOK_GROWTH = 1.2
BONFERRONI_LOOK_GROWTH = 1.5
"""The earlier rule's sparse looks (3, 5, 8, 12, 16): each costs it a share of alpha."""


@functools.lru_cache(maxsize=256)
def t_quantile(q: float, df: int) -> float:
    """Student-t quantile (cached: a session asks for the same few again and again)."""
    return student_t.t_quantile(q, df)


def planned_looks(min_repetitions: int, max_repetitions: int,
                  growth: float = LOOK_GROWTH) -> tuple[int, ...]:
    """The repetition counts at which intervals are checked: ``min``, then x``growth``
    (rounded up, at least +1; growth 1: every repetition up to ``DENSE_LOOKS_UNTIL``,
    then x``LATE_LOOK_GROWTH``), ending exactly at ``max``."""
    if min_repetitions < MIN_PAIRS:
        raise ValueError(f"min_repetitions={min_repetitions}: a t interval needs >= {MIN_PAIRS}")
    if max_repetitions < min_repetitions:
        raise ValueError(f"max_repetitions={max_repetitions} < min_repetitions={min_repetitions}")
    looks = [min_repetitions]
    while looks[-1] < max_repetitions:
        step = LATE_LOOK_GROWTH if growth <= 1 and looks[-1] >= DENSE_LOOKS_UNTIL else growth
        looks.append(min(max_repetitions, max(looks[-1] + 1, math.ceil(looks[-1] * step))))
    return tuple(looks)


@dataclass(frozen=True)
class SequentialDesign:
    """The stopping rule of one comparison (all on the paired log-ratio ``log(b/a)``)."""

    alpha: float = DEFAULT_ALPHA
    min_repetitions: int = DEFAULT_MIN_REPETITIONS
    max_repetitions: int = DEFAULT_MAX_REPETITIONS
    equivalence_margin: float = DEFAULT_EQUIVALENCE_MARGIN
    threshold_ratio: float = DEFAULT_THRESHOLD_RATIO
    futility_level: float | None = DEFAULT_FUTILITY_LEVEL
    """None: equivalence is decided by the efficacy interval itself (the earlier rule)."""
    spending: str = SPENDING_CALIBRATED
    look_growth: float = LOOK_GROWTH

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1:
            raise ValueError(f"SequentialDesign.alpha={self.alpha!r}: expected 0 < alpha < 1")
        if not self.equivalence_margin > 0:
            raise ValueError(f"SequentialDesign.equivalence_margin={self.equivalence_margin!r}: "
                             "expected > 0")
        if not self.threshold_ratio > 0:
            raise ValueError(f"SequentialDesign.threshold_ratio={self.threshold_ratio!r}: "
                             "expected > 0")
        if self.futility_level is not None and not 0 < self.futility_level < MAX_ONE_SIDED:
            raise ValueError(f"SequentialDesign.futility_level={self.futility_level!r}: "
                             "expected None or 0 < level < 0.5")
        if self.spending not in SPENDINGS:
            raise ValueError(f"SequentialDesign.spending={self.spending!r}: expected one of "
                             f"{SPENDINGS}")
        if not self.look_growth >= 1:
            raise ValueError(f"SequentialDesign.look_growth={self.look_growth!r}: expected >= 1")
        planned_looks(self.min_repetitions, self.max_repetitions)  # validates the counts

    @classmethod
    def bonferroni(cls, **overrides) -> SequentialDesign:
        """The earlier rule: alpha 5%, looks x1.5, ``alpha / K`` per look, margin 5%,
        one interval."""
        return cls(**{"alpha": BONFERRONI_ALPHA, "spending": SPENDING_BONFERRONI,
                      "futility_level": None,
                      "equivalence_margin": 0.05, "look_growth": BONFERRONI_LOOK_GROWTH,
                      **overrides})

    @property
    def looks(self) -> tuple[int, ...]:
        return planned_looks(self.min_repetitions, self.max_repetitions, self.look_growth)

    def _look_level(self, level: float, sides: int) -> float:
        if self.spending == SPENDING_BONFERRONI:
            return level / len(self.looks)
        return calibrated_look_level(self.looks, level, sides)

    @property
    def look_alpha(self) -> float:
        """The two-sided nominal level of every look's efficacy interval."""
        return self._look_level(self.alpha, 2)

    @property
    def futility_look_level(self) -> float | None:
        """The one-sided nominal level of every look's equivalence bounds (None: the
        efficacy interval decides equivalence)."""
        return None if self.futility_level is None else self._look_level(self.futility_level, 1)

    @staticmethod
    def _mean_and_se(log_ratios: Sequence[float]) -> tuple[float, float]:
        n = len(log_ratios)
        if n < MIN_PAIRS:
            raise ValueError(f"an interval needs >= {MIN_PAIRS} paired repetitions, got {n}")
        mean = math.fsum(log_ratios) / n
        var = math.fsum((x - mean) ** 2 for x in log_ratios) / (n - 1)
        return mean, math.sqrt(var / n)

    def interval(self, log_ratios: Sequence[float]) -> tuple[float, float]:
        """The look's repeated confidence interval of the mean log-ratio."""
        mean, se = self._mean_and_se(log_ratios)
        half = t_quantile(1 - self.look_alpha / 2, len(log_ratios) - 1) * se
        return mean - half, mean + half

    def equivalence_interval(self, log_ratios: Sequence[float]) -> tuple[float, float]:
        """The bounds an ``equivalent`` stop needs inside the margin."""
        level = self.futility_look_level
        if level is None:
            return self.interval(log_ratios)
        mean, se = self._mean_and_se(log_ratios)
        half = t_quantile(1 - level, len(log_ratios) - 1) * se
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
        eq_low, eq_high = self.equivalence_interval(log_ratios)
        if -margin < eq_low and eq_high < margin:
            return Decision(STOP_EQUIVALENT, VERDICT_EQUIVALENT, n, low, high, eq_low, eq_high)
        if n >= self.max_repetitions:
            return Decision(STOP_MAX, VERDICT_UNDECIDED, n, low, high)
        return None

    def to_json(self) -> dict:
        if self.spending == SPENDING_BONFERRONI:
            method = ("group-sequential repeated t intervals on paired log-ratios, "
                      "Bonferroni alpha spending over the planned looks")
        else:
            method = ("group-sequential repeated t intervals on paired log-ratios, one "
                      "nominal level per look calibrated by simulation so any look misses "
                      "with probability alpha (Pocock-type); one-sided futility bounds for "
                      "equivalence")
        return {"method": method, "spending": self.spending,
                "alpha": self.alpha, "min_repetitions": self.min_repetitions,
                "max_repetitions": self.max_repetitions, "looks": list(self.looks),
                "look_alpha": self.look_alpha, "equivalence_margin": self.equivalence_margin,
                "futility_level": self.futility_level,
                "futility_look_level": self.futility_look_level,
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
    equivalence_log_low: float | None = None
    """An ``equivalent`` stop's bounds (inside the margin), when they differ from the
    efficacy interval's."""
    equivalence_log_high: float | None = None

    def to_json(self) -> dict:
        record = {"stopped": self.reason, "verdict": self.verdict,
                  "repetitions": self.repetitions,
                  "ratio_interval": [math.exp(self.log_low), math.exp(self.log_high)]}
        if self.equivalence_log_low is not None and self.equivalence_log_high is not None:
            record["equivalence_interval"] = [math.exp(self.equivalence_log_low),
                                              math.exp(self.equivalence_log_high)]
        return record


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
