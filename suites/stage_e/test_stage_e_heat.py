"""Unit tests of the Stage E heat summary (no backend)."""

from __future__ import annotations

import pytest
from stage_e_heat import (
    coefficient_of_variation,
    critical_path_correlation,
    heat_summary,
    max_over_mean,
    straggler_load,
)


def test_stage_e_max_over_mean():
    assert max_over_mean([1, 1, 1, 1]) == 1.0
    assert max_over_mean([4, 0, 0, 0]) == 4.0
    assert max_over_mean([0, 0]) is None
    assert max_over_mean([]) is None


def test_stage_e_heat_summary_names_the_worst_layer():
    summary = heat_summary([[2, 2, 2, 2], [6, 1, 1, 0], [0, 0, 0, 0]], [[4, 4], [7, 1], [0, 0]])
    assert summary["per_layer_expert_max_over_mean"] == [1.0, 3.0, None]
    assert summary["per_layer_rank_max_over_mean"] == [1.0, pytest.approx(1.75), None]
    assert summary["worst_expert_max_over_mean"] == 3.0
    assert summary["worst_rank_max_over_mean"] == pytest.approx(1.75)
    assert heat_summary([], [])["worst_rank_max_over_mean"] is None


def test_stage_e_coefficient_of_variation():
    assert coefficient_of_variation([2, 2, 2]) == 0.0
    assert coefficient_of_variation([0, 4]) == pytest.approx(1.0)
    assert coefficient_of_variation([0, 0]) is None
    assert heat_summary([[0, 4]], [[4]])["per_layer_expert_cv"] == [pytest.approx(1.0)]


def _steps(loads, times, field="plan_to_last_dispatch_s"):
    return [{"expert_load_per_rank": [[load, 1], [load, 0]], field: time}
            for load, time in zip(loads, times, strict=True)]


def test_stage_e_correlation_follows_the_straggler_load():
    """Step time rising with the hottest rank's load: r close to 1 (hand-computed loads)."""
    steps = _steps([10, 20, 30, 40], [1.0, 2.1, 2.9, 4.0])
    result = critical_path_correlation(steps)
    assert result["straggler_routed_tokens"] == [20, 40, 60, 80]
    assert result["pearson_r"] == pytest.approx(0.9978, abs=1e-3)
    assert result["time_field"] == "plan_to_last_dispatch_s" and result["steps"] == 4
    assert straggler_load([[3, 9], [5, 1]]) == 14


def test_stage_e_correlation_prefers_the_critical_path_time():
    steps = [{**step, "afd": {"critical_path_s": 5.0 - index}}
             for index, step in enumerate(_steps([10, 20, 30], [1.0, 2.0, 3.0], "wall_time_s"))]
    result = critical_path_correlation(steps)
    assert result["time_field"] == "afd.critical_path_s"
    assert result["pearson_r"] == pytest.approx(-1.0)


def test_stage_e_correlation_is_absent_with_its_reason():
    assert "too few" in critical_path_correlation(_steps([1, 2], [1.0, 2.0]))["absent_reason"]
    assert "too few" in critical_path_correlation(_steps([5, 5, 5], [1.0, 2.0, 3.0]))[
        "absent_reason"]
    no_time = [{"expert_load_per_rank": [[1, 2]]}] * 3
    assert "no step time" in critical_path_correlation(no_time)["absent_reason"]
    assert "no step time" in critical_path_correlation([])["absent_reason"]
