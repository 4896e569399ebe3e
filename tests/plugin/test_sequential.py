"""Sequential repetitions (pytest_afd.stats.sequential, .sequential_run): seeded simulations.

Every statistical call here is shown by simulation, never by timing: coverage of the
repeated intervals under optional stopping, A/A (no false call), power (a planted
1.2x change is found), and the runner's pairing, stop records and errors.
"""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from pytest_afd.stats.sequential import (
    STOP_EQUIVALENT,
    STOP_MAX,
    STOP_THRESHOLD,
    VERDICT_HIGHER,
    VERDICT_LOWER,
    SequentialDesign,
    decide_sequence,
    paired_log_ratios,
    planned_looks,
)
from pytest_afd.stats.sequential_run import default_comparisons, run_sequential

pytest_plugins = ["pytester"]

SIMULATIONS = 2000
NOISE = 0.08
"""Per-repetition log-ratio noise (sd), about the CPU stages' (benchmarks/data)."""


def test_planned_looks_grow_and_end_at_the_maximum():
    assert planned_looks(3, 16) == tuple(range(3, 17))  # a look after every repetition
    assert planned_looks(3, 16, growth=1.5) == (3, 5, 8, 12, 16)  # the earlier rule's
    assert SequentialDesign.bonferroni().looks == (3, 5, 8, 12, 16)
    late = planned_looks(3, 1000)  # --afd-max-repeats' ceiling: x1.2 past 16, not 998 looks
    assert late[:14] == tuple(range(3, 17)) and late[14:16] == (20, 24)
    assert late[-1] == 1000 and len(late) < 40
    assert planned_looks(3, 3) == (3,)
    assert planned_looks(4, 5) == (4, 5)
    with pytest.raises(ValueError, match="max_repetitions=2 < min_repetitions=3"):
        planned_looks(3, 2)
    with pytest.raises(ValueError, match=r"alpha=1\.5"):
        SequentialDesign(alpha=1.5)


def test_interval_is_the_hand_computed_t_interval_at_the_spent_alpha():
    values = [0.1, 0.2, 0.3]
    bonferroni = SequentialDesign.bonferroni()
    half = scipy_stats.t.ppf(1 - 0.05 / 5 / 2, 2) * 0.1 / math.sqrt(3)  # sd 0.1, 5 looks
    assert bonferroni.interval(values) == pytest.approx((0.2 - half, 0.2 + half))
    design = SequentialDesign()
    # Calibrated: one level for all 14 looks, above Bonferroni's alpha / 14, below alpha.
    assert 0.05 / 14 < design.look_alpha < 0.05
    half = scipy_stats.t.ppf(1 - design.look_alpha / 2, 2) * 0.1 / math.sqrt(3)
    assert design.interval(values) == pytest.approx((0.2 - half, 0.2 + half))
    one_sided = scipy_stats.t.ppf(1 - design.futility_look_level, 2) * 0.1 / math.sqrt(3)
    assert design.equivalence_interval(values) == pytest.approx((0.2 - one_sided,
                                                                 0.2 + one_sided))


COVERAGE_SEQUENCES = 40_000
"""Vectorized coverage check: Monte Carlo se of a 5% rate is 0.11 points."""


def _miss_rates(design: SequentialDesign, true_mean: float, seed: int) -> tuple[float, float]:
    """Share of sequences whose efficacy interval at *any* planned look misses the true
    mean (the event optional stopping could pick), and whose equivalence upper bound at
    any look falls below it; quantiles from scipy, the independent reference."""
    data = np.random.default_rng(seed).normal(true_mean, NOISE,
                                              (COVERAGE_SEQUENCES, design.max_repetitions))
    missed = np.zeros(COVERAGE_SEQUENCES, dtype=bool)
    below = np.zeros(COVERAGE_SEQUENCES, dtype=bool)
    for n in design.looks:
        mean = data[:, :n].mean(axis=1)
        se = data[:, :n].std(axis=1, ddof=1) / math.sqrt(n)
        missed |= np.abs(mean - true_mean) > scipy_stats.t.ppf(1 - design.look_alpha / 2,
                                                               n - 1) * se
        if design.futility_look_level is not None:
            below |= mean + scipy_stats.t.ppf(1 - design.futility_look_level, n - 1) * se \
                < true_mean
    return float(missed.mean()), float(below.mean())


def _three_se(rate: float) -> float:
    return 3 * math.sqrt(rate * (1 - rate) / COVERAGE_SEQUENCES)


@pytest.mark.parametrize("true_mean", [0.0, math.log(1.2)])
def test_intervals_cover_the_mean_at_every_look_simultaneously(true_mean):
    """Calibrated spending uses alpha, not less: the any-look miss rate is alpha within
    Monte Carlo error (seeds unlike the calibration's), and so is the equivalence
    bounds' one-sided miss rate at the futility level."""
    design = SequentialDesign()
    missed, below = _miss_rates(design, true_mean, seed=7)
    assert design.alpha - _three_se(0.05) <= missed <= design.alpha + _three_se(0.05)
    level = design.futility_level
    assert level - _three_se(level) <= below <= level + _three_se(level)
    # Bonferroni's union bound is valid but gives alpha away (the earlier rule's cost).
    assert _miss_rates(SequentialDesign.bonferroni(), true_mean, seed=7)[0] < 0.04


def test_a_per_look_unadjusted_interval_would_not_cover_under_optional_stopping():
    """The check above can fail: the same looks at the unadjusted alpha miss too often."""
    naive = SequentialDesign.bonferroni(alpha=0.05 * 5)  # each look at 0.05: re-checking
    assert naive.look_alpha == pytest.approx(0.05)
    assert _miss_rates(naive, 0.0, seed=7)[0] > 0.05 + _three_se(0.05)


def _decisions(effect: float, rng, design=None, noise: float = NOISE):
    design = design or SequentialDesign()
    data = rng.normal(effect, noise, (SIMULATIONS, design.max_repetitions))
    return [decide_sequence(design, list(row)) for row in data]


def test_aa_makes_no_more_than_alpha_false_calls():
    decisions = _decisions(0.0, np.random.default_rng(11))
    false_calls = np.mean([d.reason == STOP_THRESHOLD for d in decisions])
    assert false_calls <= 0.05
    assert {d.reason for d in decisions} <= {STOP_THRESHOLD, STOP_EQUIVALENT, STOP_MAX}


def test_a_planted_1_2x_change_is_found_with_power_and_direction():
    decisions = _decisions(math.log(1.2), np.random.default_rng(13))
    found = [d for d in decisions if d.reason == STOP_THRESHOLD]
    assert len(found) / SIMULATIONS >= 0.8
    assert all(d.verdict == VERDICT_HIGHER for d in found)
    lower = _decisions(-math.log(1.2), np.random.default_rng(17))
    assert np.mean([d.verdict == VERDICT_LOWER for d in lower]) >= 0.8


def test_a_change_as_large_as_the_margin_is_called_equivalent_at_most_the_futility_level():
    """The equivalence stop's own error: with efficacy stops made rare (alpha 1e-4), a
    real 1.2x change (the margin) is called equivalent at the futility level, not more;
    with the futility bounds re-checked unadjusted at every look it would be more."""
    effect = math.log(1.2)
    design = SequentialDesign(alpha=1e-4)
    equivalent = np.mean([d.reason == STOP_EQUIVALENT for d in
                          _decisions(effect, np.random.default_rng(19), design, noise=0.17)])
    assert equivalent <= design.futility_level + 3 * math.sqrt(0.1 * 0.9 / SIMULATIONS)
    # Looks 3, 6, 12, 16, each at the one-sided 10% (Bonferroni's split of 40%).
    unadjusted = SequentialDesign(alpha=1e-4, spending="bonferroni", futility_level=0.4,
                                  look_growth=2.0)
    assert unadjusted.futility_look_level == pytest.approx(0.1)
    naive = np.mean([d.reason == STOP_EQUIVALENT for d in
                     _decisions(effect, np.random.default_rng(19), unadjusted, noise=0.17)])
    assert naive > design.futility_level + 3 * math.sqrt(0.1 * 0.9 / SIMULATIONS)


def test_the_calibrated_rule_spends_fewer_repetitions_than_the_bonferroni_rule():
    """At the recorded CPU noise (sd 0.17): equal cases stop equivalent instead of running
    to the maximum, and a 1.5x change is called sooner; both keep the A/A rate."""
    noise = 0.17
    for effect in (0.0, math.log(1.5)):
        new = _decisions(effect, np.random.default_rng(23), noise=noise)
        old = _decisions(effect, np.random.default_rng(23), SequentialDesign.bonferroni(),
                         noise=noise)
        assert np.mean([d.repetitions for d in new]) < np.mean([d.repetitions for d in old])
    aa = _decisions(0.0, np.random.default_rng(29), noise=noise)
    assert np.mean([d.reason == STOP_THRESHOLD for d in aa]) <= 0.05
    assert np.mean([d.verdict == "equivalent" for d in aa]) >= 0.8


def test_a_clear_change_stops_at_the_first_look_and_equal_cases_can_stop_equivalent():
    design = SequentialDesign()
    clear = decide_sequence(design, [0.5, 0.52, 0.49] + [0.5] * 13)
    assert (clear.reason, clear.repetitions) == (STOP_THRESHOLD, 3)
    tight = decide_sequence(design, [0.001, -0.001, 0.0005, -0.0005, 0.0] + [0.0] * 11)
    assert tight.reason == STOP_EQUIVALENT and tight.repetitions == 3
    noisy = decide_sequence(design, list(np.random.default_rng(1).normal(0, 0.5, 16)))
    assert noisy.reason == STOP_MAX and noisy.repetitions == 16


def test_paired_log_ratios_refuse_non_positive_values():
    assert paired_log_ratios([1.0, 2.0], [2.0, 2.0]) == pytest.approx([math.log(2), 0.0])
    with pytest.raises(ValueError, match=r"case b has non-positive .* \[0.0\]"):
        paired_log_ratios([1.0], [0.0])


class _Clock:
    """Cases whose 'wall time' is drawn from a seeded generator: one slower by ``factor``."""

    def __init__(self, factors: dict[str, float], seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.factors = factors
        self.calls: list[str] = []

    def case(self, name: str):
        def call():
            self.calls.append(name)
            return {"wall_time_s": self.factors[name] * math.exp(self.rng.normal(0, NOISE))}
        return call


def test_runner_measures_until_each_comparison_stops_and_records_why():
    clock = _Clock({"ref": 1.0, "fast": 1.0 / 1.5, "same": 1.0}, seed=3)
    cases = {name: clock.case(name) for name in clock.factors}
    run = run_sequential(cases, [("ref", "fast"), ("ref", "same")],
                         design=SequentialDesign(), warmups=1, seed=5)
    fast = run.decisions[("ref", "fast")]
    assert fast.reason == STOP_THRESHOLD and fast.verdict == VERDICT_LOWER
    counts = {name: len(run.values[name]["wall_time_s"]) for name in cases}
    assert counts["fast"] == fast.repetitions
    same = run.decisions[("ref", "same")]
    assert counts["same"] == same.repetitions and counts["ref"] == max(counts.values())
    assert clock.calls[:3] == ["ref", "fast", "same"]  # warmups first
    protocol = run.protocol_json("fast")
    assert protocol["repetitions"] == fast.repetitions
    assert [c["b"] for c in protocol["sequential"]["comparisons"]] == ["fast"]
    assert protocol["sequential"]["comparisons"][0]["stopped"] == STOP_THRESHOLD
    assert len(run.executed_order) == sum(counts.values())


def test_runner_gives_a_case_in_no_comparison_the_first_look_and_checks_names():
    clock = _Clock({"a": 1.0, "b": 1.0, "lone": 1.0})
    cases = {name: clock.case(name) for name in clock.factors}
    run = run_sequential(cases, [("a", "b")], design=SequentialDesign(max_repetitions=5),
                         warmups=0)
    assert len(run.values["lone"]["wall_time_s"]) == 3
    with pytest.raises(ValueError, match=r"comparison \('a', 'x'\) must name two"):
        run_sequential(cases, [("a", "x")], design=SequentialDesign())


def test_default_comparisons_pair_ab_sides_or_each_case_with_its_workload_reference():
    class Case:
        def __init__(self, name, workload, phase="cold"):
            self.name, self.phase = name, phase
            self.workload = type("W", (), {"name": workload, "spec": ("spec", workload)})()

    cases = [Case("u/none", "u"), Case("u/tb", "u"), Case("v/none", "v"), Case("v/tb", "v")]
    assert default_comparisons(cases) == [("u/none", "u/tb"), ("v/none", "v/tb")]
    ab = [Case("c/ab-A", "u"), Case("c/ab-B", "u")]
    assert default_comparisons(ab, ("ab-A", "ab-B")) == [("c/ab-A", "c/ab-B")]


def test_max_repeats_below_the_first_look_is_a_usage_error_naming_both(pytester):
    pytester.makepyfile(test_x="def test_x(afd_options):\n    assert afd_options.sequential\n")
    result = pytester.runpytest("--afd-sequential", "--afd-repeats", "5", "--afd-max-repeats", "4")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--afd-max-repeats=4 is below --afd-repeats=5*"])
    ok = pytester.runpytest("--afd-sequential", "--afd-max-repeats", "8")
    ok.assert_outcomes(passed=1)


@pytest.mark.parametrize("df", [1, 2, 3, 5, 11, 40, 1000])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.975, 0.995, 0.999])
def test_the_harness_t_quantile_matches_scipy(q, df):
    """The harness's own quantile (no scipy at run time) against scipy's, the reference."""
    from pytest_afd.stats.student_t import t_quantile as harness_t_quantile

    assert harness_t_quantile(q, df) == pytest.approx(float(scipy_stats.t.ppf(q, df)), abs=1e-7)
