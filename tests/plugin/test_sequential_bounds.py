"""The calibrated per-look levels (pytest_afd.stats.sequential_bounds): seeded simulations."""

import math

import numpy as np
import pytest

from pytest_afd.stats.sequential_bounds import (
    calibrated_look_level,
    calibration_target,
    crossing_rate,
    sequences_for,
    studentized_paths,
)

LOOKS = (3, 5, 8, 12, 16)
CHECK_SEQUENCES = 100_000


@pytest.mark.parametrize(("level", "sides"), [(0.05, 2), (0.10, 1)])
def test_the_calibrated_level_spends_the_level_on_sequences_it_was_not_fitted_on(level, sides):
    look_level = calibrated_look_level(LOOKS, level, sides)
    assert level / len(LOOKS) < look_level < level  # above Bonferroni, below unadjusted
    paths = studentized_paths(LOOKS, CHECK_SEQUENCES, seed=1)
    rate = crossing_rate(paths, LOOKS, look_level, sides)
    three_se = 3 * math.sqrt(level * (1 - level) / CHECK_SEQUENCES)
    assert level - 2 * three_se <= rate <= level + three_se
    # The unadjusted level at every look crosses far more often: the calibration matters.
    assert crossing_rate(paths, LOOKS, level, sides) > level + 3 * three_se


def test_one_look_needs_no_calibration_and_bad_arguments_are_named():
    assert calibrated_look_level((5,), 0.05, 2) == 0.05
    assert calibration_target(0.05, 200_000) == pytest.approx(0.05 - 2 * math.sqrt(0.05 * 0.95
                                                                                    / 200_000))
    with pytest.raises(ValueError, match="sides=3"):
        calibrated_look_level(LOOKS, 0.05, 3)
    with pytest.raises(ValueError, match=r"level=1\.5"):
        calibrated_look_level(LOOKS, 1.5, 2)


def test_long_designs_simulate_fewer_sequences_and_keep_a_wider_margin():
    assert sequences_for(LOOKS) == 200_000
    assert sequences_for((3, 1000)) == 4_000
    assert calibration_target(0.05, 4_000) < calibration_target(0.05, 200_000) < 0.05
    # Chunked draws are the same stream as one draw: the default level does not move.
    assert studentized_paths((3, 4), 30_000, seed=5)[25_000] == pytest.approx(
        studentized_paths((3, 4), 25_001, seed=5)[25_000])


def test_studentized_paths_are_the_t_statistics_of_the_prefixes():
    paths = studentized_paths((3, 4), sequences=5, seed=3)
    draws = np.random.default_rng(3).standard_normal((5, 4))
    for column, n in enumerate((3, 4)):
        x = draws[:, :n]
        expected = x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n))
        assert paths[:, column] == pytest.approx(expected)
