"""Unit tests of the Stage E heat summary (no backend)."""

from __future__ import annotations

import pytest
from stage_e_heat import heat_summary, max_over_mean


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
