"""Profile plots compare honestly: one bubble / seconds axis per figure, short case labels
broken only between names, and a "k of n cases shown" caption (issue 42)."""

from __future__ import annotations

import re

import pytest

from pytest_afd.report import profile_plots
from pytest_afd.report.loading import LoadedResult

BUBBLE_SCALES = (1.0, 3.0, 0.5, 2.0, 1.5, 4.0, 2.5, 1.2)  # eight cases; six drawn
CASE = ("suites/stage_a/test_stage_a.py::test_stage_a_overlap"
        "[token_balanced-seq{n}8192-ubatch2-layers61]")


def profile(scale: float) -> dict:
    """A two-step, two-layer profile whose bubble and layer seconds scale with ``scale``."""
    steps = [{"step": str(s), "overlap_fraction": 0.2 * s, "exposed_bubble_s": 5.6e-4 * scale}
             for s in (1, 2)]
    layers = [{"role": "attention", "layer": layer, "stage": -1, "range": "attention",
               "component": "attention", "seconds": 2e-4 * scale, "max_rank_seconds": 2e-4}
              for layer in (0, 1)]
    return {"per_step": steps, "per_layer": layers}


def results() -> list[LoadedResult]:
    return [LoadedResult(None, {"case_id": CASE.format(n=n),
                                "settings": {"split_policy": "token_balanced"},
                                "evidence": {"profile": profile(scale)}})
            for n, scale in enumerate(BUBBLE_SCALES)]


def _texts(figure) -> list[str]:
    return [text.get_text() for text in figure.findobj(lambda a: hasattr(a, "get_text"))]


def test_overlap_panels_share_one_bubble_axis_and_say_how_many_are_shown(tmp_path):
    figure = profile_plots.draw_result_overlap(results())
    twins = [axis for axis in figure.axes if axis.get_ylabel() == "exposed bubble (s)"]
    assert len(twins) == profile_plots.MAX_PROFILE_PANELS
    assert len({axis.get_ylim() for axis in twins}) == 1  # 4x the bubble sits 4x higher
    assert twins[0].get_ylim()[1] >= 5.6e-4 * max(BUBBLE_SCALES[:6])
    assert "6 of 8 profiled cases shown" in " ".join(_texts(figure))
    figure.savefig(tmp_path / "overlap.png")


def test_layer_panels_share_one_axis_and_caption():
    figure = profile_plots.draw_result_layers(results())
    assert len({axis.get_ylim() for axis in figure.axes}) == 1
    assert "6 of 8 profiled cases shown" in " ".join(_texts(figure))
    one = profile_plots.draw_layers([("profile", profile(1.0))])
    assert "1 of 1 profiled case shown" in " ".join(_texts(one))


@pytest.mark.parametrize("case_id", [CASE.format(n=0), "tests/x.py::test_short",
                                     "t.py::test_" + "averyveryverylongname" * 3 + "[a-b]"])
def test_case_labels_break_between_names_only(case_id):
    label = profile_plots.case_label(case_id, "token_balanced")
    lines = label.split("\n")
    assert lines[0] == "token_balanced"
    assert len(lines) <= 1 + profile_plots.LABEL_LINES
    assert all(len(line) <= profile_plots.LABEL_CHARS for line in lines)
    assert "suites/" not in label and "test_" not in label
    # Every line ends at a name boundary of the id (or is cut with an ellipsis).
    name = case_id.rsplit("::", 1)[-1].removeprefix("test_")
    for line in lines[1:]:
        body = line.removesuffix(profile_plots.ELLIPSIS)
        assert body in name
        end = name.index(body) + len(body)
        assert line.endswith(profile_plots.ELLIPSIS) or end == len(name) or \
            re.match(r"[\[\-, ]", name[end]) or name[end - 1] in "-,"
