"""The point call's statistics: t quantiles, A/A false calls, power and coverage by seeded simulation."""

import math

import numpy as np
import pytest

from pytest_afd.study import effects
from pytest_afd.study.effects import (
    NO_DIFFERENCE,
    REQUEST_BOUNDARY,
    TOKEN_BALANCED,
    UNDECIDED,
    ratio_interval,
    t_quantile,
    throughput_call,
)

SIMULATIONS = 1000
FALSE_CALL_LIMIT = 0.05  # the interval's own error rate; the minimum effect only lowers it


@pytest.mark.parametrize(("df", "expected"), [(1, 12.706205), (2, 4.302653), (4, 2.776445),
                                              (10, 2.228139), (30, 2.042272)])
def test_t_quantile_matches_the_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-5)


def test_t_quantile_refuses_a_bad_probability_naming_it():
    with pytest.raises(ValueError, match=r"probability=0\.2"):
        t_quantile(0.2, 3)


def _sides(rng, ratio, cv, n):
    control = 1000.0 * np.exp(rng.normal(0.0, cv, n))
    proposed = 1000.0 * ratio * np.exp(rng.normal(0.0, cv, n))
    return control.tolist(), proposed.tolist()


@pytest.mark.parametrize(("cv", "n"), [(0.05, 3), (0.10, 3), (0.05, 5), (0.02, 8)])
def test_aa_data_gives_no_policy_call(cv, n):
    rng = np.random.default_rng(41)
    calls = [throughput_call(ratio_interval(*_sides(rng, 1.0, cv, n))) for _ in range(SIMULATIONS)]
    false = sum(call in (TOKEN_BALANCED, REQUEST_BOUNDARY) for call in calls) / SIMULATIONS
    assert false <= FALSE_CALL_LIMIT, f"A/A false-call rate {false:.3f} at cv {cv}, n {n}"


def test_a_series_of_aa_points_stays_under_five_percent_family_wise():
    """Six points stated together: Bonferroni keeps P(any false call) <= 5 %, not 6 x 2.5 %."""
    rng = np.random.default_rng(5)
    family = 6
    series_with_a_call = 0
    for _ in range(SIMULATIONS // 2):
        calls = [throughput_call(ratio_interval(*_sides(rng, 1.0, 0.10, 3), family))
                 for _ in range(family)]
        series_with_a_call += any(call in (TOKEN_BALANCED, REQUEST_BOUNDARY) for call in calls)
    assert series_with_a_call / (SIMULATIONS // 2) <= FALSE_CALL_LIMIT


def test_a_family_widens_each_interval():
    a, b = [100.0, 103.0, 98.0], [120.0, 118.0, 123.0]
    alone, in_six = ratio_interval(a, b), ratio_interval(a, b, 6)
    assert in_six.low < alone.low and in_six.high > alone.high and in_six.ratio == alone.ratio
    assert in_six.to_json()["simultaneous_over"] == 6


@pytest.mark.parametrize(("ratio", "expected"), [(1.2, TOKEN_BALANCED), (1 / 1.2, REQUEST_BOUNDARY)])
def test_a_planted_twenty_percent_is_called(ratio, expected):
    rng = np.random.default_rng(7)
    calls = [throughput_call(ratio_interval(*_sides(rng, ratio, 0.05, 5))) for _ in range(SIMULATIONS)]
    power = calls.count(expected) / SIMULATIONS
    assert power >= 0.95, f"power {power:.3f} for a planted x{ratio:.3f} at cv 0.05, n 5"


def test_the_interval_covers_the_planted_ratio_at_its_confidence():
    rng = np.random.default_rng(11)
    covered = 0
    for _ in range(SIMULATIONS):
        interval = ratio_interval(*_sides(rng, 1.2, 0.05, 3))
        covered += interval.low <= 1.2 <= interval.high
    assert 0.93 <= covered / SIMULATIONS <= 0.97


def test_a_tight_aa_interval_is_a_decided_no_difference():
    rng = np.random.default_rng(3)
    calls = [throughput_call(ratio_interval(*_sides(rng, 1.0, 0.01, 5))) for _ in range(200)]
    assert calls.count(NO_DIFFERENCE) / 200 >= 0.95


def test_a_clear_but_small_change_is_no_recommendation():
    """x1.03 with a tight interval excludes 1 but is under the minimum effect: nothing to act on."""
    interval = effects.RatioInterval(1.03, 1.02, 1.06, 5, 5)
    assert throughput_call(interval) == UNDECIDED
    assert effects.recommendation(UNDECIDED) == effects.NO_RECOMMENDATION


def test_ttft_moving_against_the_throughput_call_is_flagged():
    worse = effects.RatioInterval(1.3, 1.2, 1.4, 5, 5)
    assert effects.ttft_contradicts(TOKEN_BALANCED, worse)
    assert not effects.ttft_contradicts(TOKEN_BALANCED, effects.RatioInterval(0.9, 0.8, 1.0, 5, 5))


def test_bad_repetitions_are_named():
    with pytest.raises(ValueError, match=r"control repetitions: 1 repetition"):
        ratio_interval([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"proposed repetitions: .*0\.0"):
        ratio_interval([1.0, 2.0], [0.0, 2.0])


def test_identical_repetitions_give_an_exact_ratio():
    interval = ratio_interval([2.0, 2.0], [3.0, 3.0])
    assert interval.low == interval.high == pytest.approx(1.5)
    assert math.isfinite(interval.ratio)
