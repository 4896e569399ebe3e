"""One tested point's effect: token_balanced over request_boundary, with a 95 % interval, and its call.

The interval is Welch's t interval on the log of the repetitions (tokens/s,
TTFT), exponentiated: a ratio of geometric means. It is computed once per
point at publication, over all repetitions the study holds, never re-checked
after each repetition, so a fixed-sample interval is valid (an interval that
is watched while the runs come in would need an anytime-valid one instead).

The call needs both a clear interval and a minimum effect
(:data:`MIN_EFFECT`): a throughput ratio whose interval excludes 1 but whose
estimate is within 5 % of 1 decides nothing a performance engineer would act
on, so A/A data gives no recommendation. An interval that lies inside
±:data:`MIN_EFFECT` is a decided "no difference". tests/study/test_effects.py
measures the false-call rate on A/A data and the power on a planted 1.2x by
seeded simulation. The points of one series are stated together, so their
intervals are simultaneous (Bonferroni over the series' points): a series of
A/A points makes any false call at most 5 % of the time.

The Student-t quantile is :mod:`pytest_afd.stats.student_t` (numpy has none and the
project does not depend on scipy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_afd.stats.student_t import t_quantile

CONFIDENCE = 0.95
MIN_EFFECT = 0.05
"""Smallest relative change the study acts on (5 %): a recommendation needs more than this."""
MIN_SIDE_REPETITIONS = 2
"""Welch's interval needs a variance on each side."""

TOKEN_BALANCED = "token_balanced"
REQUEST_BOUNDARY = "request_boundary"
NO_DIFFERENCE = "no_difference"
UNDECIDED = "undecided"
CALLS = (TOKEN_BALANCED, REQUEST_BOUNDARY, NO_DIFFERENCE, UNDECIDED)
NO_RECOMMENDATION = "no recommendation"

@dataclass(frozen=True)
class RatioInterval:
    """Ratio of geometric means (b / a) with its 95 % Welch interval, from ``n_a``/``n_b`` repetitions."""

    ratio: float
    low: float
    high: float
    n_a: int
    n_b: int
    se: float = 0.0
    """Standard error of the log ratio (0: exact)."""
    df: float = math.inf
    """Welch-Satterthwaite degrees of freedom of the log ratio."""
    family: int = 1
    """Simultaneous over this many intervals (Bonferroni): each holds at >= the confidence."""

    def to_json(self) -> dict[str, float | int]:
        return {"ratio": self.ratio, "low": self.low, "high": self.high,
                "confidence": CONFIDENCE, "simultaneous_over": self.family,
                "n_control": self.n_a, "n_proposed": self.n_b}

    def text(self) -> str:
        return f"x{self.ratio:.3f} [{self.low:.3f}, {self.high:.3f}]"


def _log_moments(values: Sequence[float], what: str) -> tuple[float, float, int]:
    if len(values) < MIN_SIDE_REPETITIONS:
        raise ValueError(f"{what}: {len(values)} repetition(s); a Welch interval needs "
                         f">= {MIN_SIDE_REPETITIONS} per side")
    if any(not math.isfinite(v) or v <= 0 for v in values):
        raise ValueError(f"{what}: repetitions {list(values)!r} must be finite and > 0")
    logs = [math.log(v) for v in values]
    mean = sum(logs) / len(logs)
    variance = sum((v - mean) ** 2 for v in logs) / (len(logs) - 1)
    return mean, variance, len(logs)


def ratio_interval(control: Sequence[float], proposed: Sequence[float],
                   family: int = 1) -> RatioInterval:
    """Welch's interval for proposed / control on log repetitions (geometric-mean ratio).

    ``family``: the interval is one of that many stated together (a series'
    points); Bonferroni keeps all of them jointly at :data:`CONFIDENCE`, so a
    series of k A/A points makes a false call at most 5 % of the time, not k x 2.5 %.
    """
    mean_a, var_a, n_a = _log_moments(control, "control repetitions")
    mean_b, var_b, n_b = _log_moments(proposed, "proposed repetitions")
    diff = mean_b - mean_a
    se2_a, se2_b = var_a / n_a, var_b / n_b
    se = math.sqrt(se2_a + se2_b)
    df = (se2_a + se2_b) ** 2 / (se2_a**2 / (n_a - 1) + se2_b**2 / (n_b - 1)) if se else math.inf
    return _interval(diff, se, df, n_a, n_b, family)


def _interval(log_ratio: float, se: float, df: float, n_a: int, n_b: int,
              family: int) -> RatioInterval:
    if family < 1:
        raise ValueError(f"family={family!r}: expected >= 1 interval")
    if se == 0.0:  # identical repetitions on both sides: the ratio is exact
        exact = math.exp(log_ratio)
        return RatioInterval(exact, exact, exact, n_a, n_b, family=family)
    half = t_quantile(1 - (1 - CONFIDENCE) / (2 * family), df) * se
    return RatioInterval(math.exp(log_ratio), math.exp(log_ratio - half),
                         math.exp(log_ratio + half), n_a, n_b, se, df, family)


def pooled_interval(points: Sequence[RatioInterval]) -> RatioInterval:
    """The mean log ratio over independent points (one region), with its Welch-Satterthwaite interval.

    Each point is its own pair of cases, so their log ratios are independent:
    the mean's variance is the sum of the points' variances over k squared.
    The pooled interval belongs to the same family as its points.
    """
    if not points:
        raise ValueError("pooled_interval() needs at least one point")
    k = len(points)
    log_ratio = sum(math.log(p.ratio) for p in points) / k
    variance = sum(p.se**2 for p in points) / k**2
    n_a, n_b = sum(p.n_a for p in points), sum(p.n_b for p in points)
    family = max(p.family for p in points)
    if variance == 0.0:
        return _interval(log_ratio, 0.0, math.inf, n_a, n_b, family)
    df = (sum(p.se**2 for p in points) ** 2
          / sum(p.se**4 / p.df for p in points if p.se > 0.0))
    return _interval(log_ratio, math.sqrt(variance), df, n_a, n_b, family)


def throughput_call(interval: RatioInterval, min_effect: float = MIN_EFFECT) -> str:
    """The decided call from a throughput ratio (token_balanced / request_boundary)."""
    up, down = 1.0 + min_effect, 1.0 / (1.0 + min_effect)
    if interval.low > 1.0 and interval.ratio >= up:
        return TOKEN_BALANCED
    if interval.high < 1.0 and interval.ratio <= down:
        return REQUEST_BOUNDARY
    if down <= interval.low and interval.high <= up:
        return NO_DIFFERENCE
    return UNDECIDED


def ttft_contradicts(call: str, ttft: RatioInterval | None, min_effect: float = MIN_EFFECT) -> bool:
    """Whether TTFT (proposed / control; lower is better) clearly moves against the throughput call."""
    if ttft is None:
        return False
    if call == TOKEN_BALANCED:
        return ttft.low > 1.0 and ttft.ratio >= 1.0 + min_effect
    if call == REQUEST_BOUNDARY:
        return ttft.high < 1.0 and ttft.ratio <= 1.0 / (1.0 + min_effect)
    return False


def recommendation(call: str) -> str:
    """The policy a call recommends, or "no recommendation"."""
    return call if call in (TOKEN_BALANCED, REQUEST_BOUNDARY) else NO_RECOMMENDATION
