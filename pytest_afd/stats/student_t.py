"""Student's t distribution without scipy: its CDF and quantile.

numpy has no t quantile and the project does not depend on scipy, yet two rooms need one:
the sequential rule's interval at each look (:mod:`pytest_afd.stats.sequential`) and the
study's Welch intervals (:mod:`pytest_afd.study.effects`). The regularized incomplete beta
is evaluated by Lentz's continued fraction; the quantile by bisection on the CDF. The tests
check it against scipy's as an independent reference.
"""

from __future__ import annotations

import math

MEDIAN_PROBABILITY = 0.5
_CF_ITERATIONS = 300
_CF_EPSILON = 3e-14
_CF_TINY = 1e-300
_BISECTION_STEPS = 64


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Lentz's evaluation of the incomplete beta continued fraction (converges for x < (a+1)/(a+b+2))."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
    result = d
    for m in range(1, _CF_ITERATIONS + 1):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _CF_TINY else _CF_TINY
            result *= d * c
        if abs(d * c - 1.0) < _CF_EPSILON:
            break
    return result


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (real, > 0) degrees of freedom."""
    tail = 0.5 * regularized_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(probability: float, df: float) -> float:
    """The ``probability`` quantile of Student's t (bisection on :func:`t_cdf`)."""
    if not MEDIAN_PROBABILITY <= probability < 1.0 or df <= 0:
        raise ValueError(f"t_quantile(probability={probability!r}, df={df!r}): "
                         "expected 0.5 <= probability < 1 and df > 0")
    low, high = 0.0, 1.0
    while t_cdf(high, df) < probability:
        high *= 2.0
    for _ in range(_BISECTION_STEPS):
        middle = (low + high) / 2.0
        low, high = (middle, high) if t_cdf(middle, df) < probability else (low, middle)
    return (low + high) / 2.0
