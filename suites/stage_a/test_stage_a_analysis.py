"""Unit tests of the Stage A analysis (no backend): ranking, correlation, AFD evidence."""

from __future__ import annotations

import math

import pytest
from stage_a_analysis import (
    AFD_OVERLAP_KEYS,
    NO_SIGNIFICANT_DIFFERENCE,
    afd_overlap,
    confirmation_case_policies,
    confirmation_policies,
    correlation_evidence,
    pearson,
    pick_winner,
    policy_scores,
    rank_policies,
)

from pytest_afd.stats.repetitions import bootstrap_interval, iqrs_overlap


def _throughput(values):
    return {
        (workload, policy): value
        for workload, row in values.items()
        for policy, value in zip(("none", "request_boundary", "token_balanced"), row, strict=True)
    }


def test_stage_a_winner_is_the_best_geometric_mean_over_workloads():
    throughput = _throughput({"uniform": (100, 110, 120), "long_short": (50, 40, 80)})
    scores = policy_scores(throughput)
    assert scores["none"] == pytest.approx(1.0)
    assert scores["token_balanced"] == pytest.approx(math.sqrt(1.2 * 1.6))
    assert pick_winner(throughput) == "token_balanced"


def test_stage_a_winner_is_not_fooled_by_one_large_workload():
    # Request-boundary wins on a workload with huge absolute throughput, loses elsewhere.
    throughput = _throughput({"big": (1000, 1100, 1050), "a": (10, 8, 12), "b": (10, 8, 12)})
    assert pick_winner(throughput) == "token_balanced"


def test_stage_a_ranking_needs_the_baseline():
    with pytest.raises(ValueError, match="'none'"):
        policy_scores({("uniform", "token_balanced"): 1.0})


def test_stage_a_confirmation_keeps_two_split_policies():
    assert confirmation_policies("token_balanced") == ("request_boundary", "token_balanced")
    assert confirmation_policies("none") == ("request_boundary", "token_balanced")
    assert confirmation_policies("request_boundary") == ("request_boundary", "token_balanced")
    assert confirmation_policies(None) == ("request_boundary", "token_balanced")


def _repetitions(values):
    return {
        (workload, policy): reps
        for workload, row in values.items()
        for policy, reps in zip(("none", "request_boundary", "token_balanced"), row, strict=True)
    }


def test_stage_a_forced_none_win_builds_unique_confirmation_cases():
    """The regression: a significant `none` win made duplicate case names."""
    reps = _repetitions({
        "uniform": ([200, 201, 199], [100, 101, 99], [110, 111, 109]),
        "long_short": ([150, 151, 149], [80, 81, 79], [90, 91, 89]),
    })  # fmt: skip
    ranking = rank_policies(reps)
    assert ranking["winner"] == "none" and ranking["significant"]
    policies = confirmation_case_policies(ranking["winner"])
    assert policies == ("none", "request_boundary", "token_balanced")
    names = [f"{w}/{p}" for w in ("long_short", "uniform") for p in policies]
    assert len(names) == len(set(names))


def test_stage_a_no_winner_within_noise():
    """Medians 5% apart with 25-65% spread between repetitions: no significant difference."""
    reps = _repetitions({
        "uniform": ([100, 60, 150], [105, 62, 160], [110, 58, 170]),
        "long_short": ([80, 50, 120], [84, 45, 130], [88, 52, 125]),
    })  # fmt: skip
    ranking = rank_policies(reps)
    assert ranking["winner"] is None and not ranking["significant"]
    assert ranking["verdict"] == NO_SIGNIFICANT_DIFFERENCE
    assert ranking["leader"] == "token_balanced"
    low, high = ranking["leader_vs_runner_up"]["interval"]
    assert low <= 1.0 <= high
    assert confirmation_case_policies(ranking["winner"]) == (
        "none", "request_boundary", "token_balanced"
    )


def test_stage_a_clear_winner_beyond_noise():
    reps = _repetitions({
        "uniform": ([100, 99, 101], [110, 109, 111], [130, 129, 131]),
        "long_short": ([50, 49, 51], [40, 39, 41], [80, 79, 81]),
    })  # fmt: skip
    ranking = rank_policies(reps)
    assert ranking["winner"] == "token_balanced" and ranking["leader_vs_runner_up"]["interval"][0] > 1


def test_stage_a_lead_inside_the_between_session_noise_is_no_winner():
    """Tight repetitions make the bootstrap interval exclude 1, but a 10 % lead is inside
    what sessions on a busy host move a stage's geometric mean by."""
    reps = _repetitions({
        "uniform": ([100, 99, 101], [100, 99, 101], [110, 109, 111]),
        "long_short": ([50, 49, 51], [50, 49, 51], [55, 54, 56]),
    })  # fmt: skip
    ranking = rank_policies(reps)
    assert ranking["leader_vs_runner_up"]["interval"][0] > 1
    assert ranking["winner"] is None and ranking["verdict"] == NO_SIGNIFICANT_DIFFERENCE


def test_noise_helpers():
    assert iqrs_overlap([1, 2, 3], [2, 2.5, 3]) and not iqrs_overlap([1, 2, 3], [10, 11, 12])
    low, high = bootstrap_interval({"a": [1, 2, 3], "b": [4, 5, 6]}, lambda m: m["b"] - m["a"])
    assert 0 < low <= 3 <= high
    with pytest.raises(ValueError, match="no finite repetitions"):
        bootstrap_interval({"a": []}, lambda m: 0.0)


def test_stage_a_pearson():
    assert pearson([0, 1, 2], [1, 3, 5]) == pytest.approx(1.0)
    assert pearson([0, 1, 2], [5, 3, 1]) == pytest.approx(-1.0)
    assert pearson([0, 1], [1, 2]) is None  # too few points
    assert pearson([1, 1, 1], [1, 2, 3]) is None  # constant side
    with pytest.raises(ValueError, match="3 x values but 2"):
        pearson([1, 2, 3], [1, 2])


def test_stage_a_afd_overlap_reads_only_steps_with_afd_evidence():
    assert afd_overlap([{"imbalance": 0.1}]) is None
    steps = [
        {"overlap_fraction": 0.5, "straggler_s": 0.2, "exposed_bubble_s": 0.1},
        {"overlap_fraction": 0.7, "straggler_s": 0.0, "exposed_bubble_s": 0.3},
        {"imbalance": 0.0},
    ]
    assert afd_overlap(steps) == pytest.approx(
        {"overlap_fraction": 0.6, "straggler_s": 0.1, "exposed_bubble_s": 0.2}
    )


def test_stage_a_afd_overlap_keeps_an_absent_straggler_absent_never_zero():
    one_rank = {"value": None, "absent_reason": "one FFN rank: no other rank"}
    steps = [
        {"overlap_fraction": 0.5, "straggler_s": one_rank, "exposed_bubble_s": 0.1},
        {"overlap_fraction": 0.7, "straggler_s": one_rank, "exposed_bubble_s": 0.3},
    ]
    overlap = afd_overlap(steps)
    assert overlap["overlap_fraction"] == pytest.approx(0.6)
    assert overlap["straggler_s"] == {"value": None, "absent_reason": "one FFN rank: no other rank"}
    # A step that measured it: its value alone makes the mean (the absent one is not a 0).
    steps.append({"overlap_fraction": 0.6, "straggler_s": 0.4, "exposed_bubble_s": 0.2})
    assert afd_overlap(steps)["straggler_s"] == pytest.approx(0.4)


def test_stage_a_correlation_skips_points_whose_straggler_is_absent():
    one_rank = {"value": None, "absent_reason": "one FFN rank"}
    points = [
        {"workload": w, "policy": "rb", "imbalance": i, "relative_run_time": 1 + i,
         "overlap_fraction": 1 - i, "exposed_bubble_s": i, "straggler_s": s}
        for w, i, s in (("a", 0.6, 0.3), ("b", 0.3, 0.2), ("c", 0.0, 0.1), ("d", 0.9, one_rank))
    ]
    evidence = correlation_evidence(points)
    # Read as 0, point d would break the perfect correlation of the other three.
    assert evidence["imbalance_vs_straggler_s_r"] == pytest.approx(1.0)
    assert evidence["imbalance_vs_exposed_bubble_s_r"] == pytest.approx(1.0)
    for point in points:
        point["straggler_s"] = one_rank
    assert correlation_evidence(points)["imbalance_vs_straggler_s_r"] is None


def test_stage_a_correlation_uses_split_cases_and_afd_points_when_present():
    points = [
        {"workload": "w", "policy": "none", "imbalance": None, "relative_run_time": 1.0},
        {"workload": "a", "policy": "rb", "imbalance": 0.6, "relative_run_time": 1.6},
        {"workload": "b", "policy": "rb", "imbalance": 0.3, "relative_run_time": 1.3},
        {"workload": "c", "policy": "tb", "imbalance": 0.0, "relative_run_time": 1.0},
    ]
    evidence = correlation_evidence(points)
    assert evidence["imbalance_vs_relative_run_time_r"] == pytest.approx(1.0)
    assert all(evidence[f"imbalance_vs_{key}_r"] is None for key in AFD_OVERLAP_KEYS)
    for point, bubble in zip(points[1:], (0.3, 0.2, 0.1), strict=True):
        point.update(overlap_fraction=1 - bubble, straggler_s=bubble / 2, exposed_bubble_s=bubble)
    evidence = correlation_evidence(points)
    assert evidence["imbalance_vs_exposed_bubble_s_r"] == pytest.approx(1.0)
    assert evidence["imbalance_vs_overlap_fraction_r"] == pytest.approx(-1.0)
