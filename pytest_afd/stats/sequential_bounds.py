"""The per-look levels of the sequential rule: alpha spent exactly, not by a union bound.

Bonferroni spending (``alpha / K`` at each of ``K`` looks) is valid whatever the looks'
dependence, but the looks of one comparison are strongly dependent (look 8 contains
look 5's data), so it gives up much of ``alpha``: the rule measured 2.8% A/A false
calls for a 5% design. Here every look gets the *same* nominal level ``a`` (a
Pocock-type boundary, Jennison & Turnbull 2000, ch. 2 and 9), and ``a`` is chosen so
that the chance that **any** look's t statistic crosses its quantile is ``level``.

Why a simulation gives the exact answer: the studentized statistic
``(mean_n - mu) / (s_n / sqrt n)`` at every look has a joint distribution that depends
on neither ``mu`` nor ``sigma`` (for i.i.d. normal data), so the crossing probability
is one number per (looks, level), the same under A/A and under any planted change.
It is estimated once from ``SEQUENCES`` seeded standard-normal sequences, and the
level is calibrated to ``level`` minus two Monte Carlo standard errors, so the
estimate's own error cannot make the rule exceed ``level``. The result is cached:
a session computes it once per design (about a second).

The same calibration, one-sided, gives the futility/equivalence boundary (the chance
that any look's upper bound falls below the true mean is ``level``).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from pytest_afd.stats import student_t

SEQUENCES = 200_000
"""Simulated sequences per calibration: Monte Carlo sd of a 5% rate is 0.05 points."""
CALIBRATION_SEED = 20261207
MONTE_CARLO_SES = 2.0
"""The calibration target is ``level - 2 * se``: valid even if the estimate is high."""
BISECTION_STEPS = 24
CHUNK_SEQUENCES = 20_000
DRAW_BUDGET = 4_000_000
MIN_SEQUENCES = 4_000
ONE_SIDED, TWO_SIDED = 1, 2
SIDES = (ONE_SIDED, TWO_SIDED)


def studentized_paths(looks: tuple[int, ...], sequences: int = SEQUENCES,
                      seed: int = CALIBRATION_SEED) -> np.ndarray:
    """``t_k = mean_k / (s_k / sqrt n_k)`` at every look of i.i.d. N(0, 1) sequences
    (rows: sequences, columns: looks)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for start in range(0, sequences, CHUNK_SEQUENCES):  # bounded memory at 1000 repetitions
        draws = rng.standard_normal((min(CHUNK_SEQUENCES, sequences - start), max(looks)))
        sums = np.cumsum(draws, axis=1)
        squares = np.cumsum(draws * draws, axis=1)
        columns = []
        for n in looks:
            mean = sums[:, n - 1] / n
            var = (squares[:, n - 1] - n * mean * mean) / (n - 1)
            columns.append(mean / np.sqrt(np.maximum(var, 1e-300) / n))
        blocks.append(np.stack(columns, axis=1))
    return np.concatenate(blocks)


def look_quantiles(looks: tuple[int, ...], look_level: float, sides: int) -> np.ndarray:
    """Each look's t quantile at the nominal level (``sides``-sided)."""
    return np.array([student_t.t_quantile(1.0 - look_level / sides, n - 1) for n in looks])


def crossing_rate(paths: np.ndarray, looks: tuple[int, ...], look_level: float,
                  sides: int) -> float:
    """Share of sequences whose statistic crosses its quantile at any look."""
    stats = np.abs(paths) if sides == TWO_SIDED else paths
    return float(np.mean((stats > look_quantiles(looks, look_level, sides)).any(axis=1)))


def calibration_target(level: float, sequences: int = SEQUENCES) -> float:
    return level - MONTE_CARLO_SES * math.sqrt(level * (1.0 - level) / sequences)


def sequences_for(looks: tuple[int, ...]) -> int:
    """``SEQUENCES``, fewer past ``DRAW_BUDGET`` normal draws (a maximum of hundreds of
    repetitions): the calibration target then keeps a wider Monte Carlo margin."""
    return min(SEQUENCES, max(MIN_SEQUENCES, DRAW_BUDGET // max(looks)))


@functools.lru_cache(maxsize=64)
def calibrated_look_level(looks: tuple[int, ...], level: float, sides: int = 2,
                          sequences: int | None = None, seed: int = CALIBRATION_SEED) -> float:
    """The largest per-look nominal level whose simulated any-look crossing rate stays
    within the calibration target (bisection between Bonferroni's ``level / K``, always
    valid, and ``level``). One look needs no simulation: its level is ``level``."""
    sequences = sequences_for(looks) if sequences is None else sequences
    if sides not in SIDES:
        raise ValueError(f"sides={sides!r}: expected one of {SIDES}")
    if not 0 < level < 1:
        raise ValueError(f"level={level!r}: expected 0 < level < 1")
    if len(looks) == 1:
        return level
    paths = studentized_paths(looks, sequences, seed)
    target = calibration_target(level, sequences)
    low, high = math.log(level / len(looks)), math.log(level)
    if crossing_rate(paths, looks, math.exp(low), sides) > target:
        return math.exp(low)  # Bonferroni: valid by the union bound whatever the estimate
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2.0
        if crossing_rate(paths, looks, math.exp(middle), sides) <= target:
            low = middle
        else:
            high = middle
    return math.exp(low)
