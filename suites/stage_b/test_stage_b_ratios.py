"""Unit tests of the Stage B ratio selection (no backend)."""

from __future__ import annotations

import pytest
from stage_b_ratios import ratio_label, realizable_ratios


def test_stage_b_realizable_ratios_step_down_only_at_the_top():
    def build(ratio):
        if ratio > 0.8:
            raise ValueError(f"ratio {ratio} too high")
        return ratio

    workloads, notes = realizable_ratios(build, (0.0, 0.5, 0.9))
    assert sorted(workloads) == [0.0, 0.5, 0.8]
    assert "requested 90% is not realizable" in notes[0.8]
    with pytest.raises(ValueError, match="too high"):
        realizable_ratios(build, (0.85, 0.9))  # a non-top ratio never steps down


def test_stage_b_ratio_label():
    assert ratio_label(0.25) == "hit25"
    assert ratio_label(0.0) == "hit0"
