"""Plots of ``evidence.profile`` (docs/profiling.md): per-layer components and per-step overlap.

Used by the report (instrumented cases) and by ``profile-summary`` (one profile).
Panels compare honestly: one y scale per figure (the overlap plot's exposed-bubble
axis and the layer plot's seconds are shared by every panel, so a dot 3x higher
is 3x larger), case labels are shortened and wrapped at word boundaries only, and
a caption says how many of the profiled cases the figure shows.
"""

from __future__ import annotations

import textwrap
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from pytest_afd.report import layout
from pytest_afd.report.loading import LoadedResult
from pytest_afd.report.values import is_absent

MAX_PROFILE_PANELS = 6  # the first six instrumented cases; the JSON has every one
LAYERS_PLOT = "profile_layers"
OVERLAP_PLOT = "profile_overlap"
LABEL_CHARS = 30  # per title line
LABEL_LINES = 3  # of the test name and parameters, under the policy line
ELLIPSIS = "…"
TEST_PREFIX = "test_"


def case_label(case_id: str, policy: str | None = None) -> str:
    """A short panel title: the policy, then the test's own name and parameters (no file
    path, no ``test_``), wrapped at parameter boundaries (``[``, ``-``, ``,``, space), never inside
    a name; a name or line that does not fit ends in an ellipsis."""
    text = case_id.rsplit("::", 1)[-1].removeprefix(TEST_PREFIX)
    spaced = text.replace("[", " [").replace("-", "- ").replace(",", ", ")
    lines = textwrap.wrap(spaced, width=LABEL_CHARS, break_long_words=False,
                          break_on_hyphens=False)
    lines = [layout.shorten(line.replace("- ", "-").replace(",  ", ", "), LABEL_CHARS)
             for line in lines]
    if len(lines) > LABEL_LINES:
        lines = lines[:LABEL_LINES]
        lines[-1] = lines[-1].rstrip("_-") + ELLIPSIS
    return "\n".join(([layout.shorten(policy, LABEL_CHARS)] if policy else []) + lines)


def caption(shown: int, total: int) -> str:
    return (f"{shown} of {total} profiled case{'s' if total != 1 else ''} shown"
            + ("" if shown == total else " (the first ones; the JSON has every case)"))


def _share_y(axes: Sequence[Any]) -> None:
    """One y scale for all ``axes`` (the widest of their own ranges)."""
    if axes:
        top = max(axis.get_ylim()[1] for axis in axes)
        for axis in axes:
            axis.set_ylim(0.0, top)


def result_profile(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    profile = doc.get("evidence", {}).get("profile")
    return None if profile is None or is_absent(profile) else profile


def layer_components(profile: Mapping[str, Any]) -> list[dict[str, float]]:
    """Per layer (0..max): seconds per step by ``role/component`` (the report's bar format)."""
    totals: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for row in profile.get("per_layer", []):
        if row["layer"] >= 0:
            totals[row["layer"]][f"{row['role']}/{row['component']}"] += row["seconds"]
    if not totals:
        return []
    return [dict(sorted(totals[layer].items())) for layer in range(max(totals) + 1)]


def overlap_series(profile: Mapping[str, Any]) -> list[tuple[str, float | None, float | None]]:
    """(step, overlap fraction, exposed bubble s) per step; None where absent."""
    def number(value):
        return value if isinstance(value, (int, float)) else None

    return [(str(s["step"]), number(s.get("overlap_fraction")), number(s.get("exposed_bubble_s")))
            for s in profile.get("per_step", [])]


def draw_layers(panels: Sequence[tuple[str, Mapping[str, Any]]]) -> Figure | None:
    """Stacked seconds per step per layer, by role/component, one panel per profile."""
    panels = [(title, layer_components(profile)) for title, profile in panels]
    with_data = [(title, layers) for title, layers in panels if layers]
    shown = with_data[:MAX_PROFILE_PANELS]
    if not shown:
        return None
    figure = layout.layer_bar_panels(shown, ylabel="s per step (rank mean)")
    for axis, (title, _) in zip(figure.axes, shown, strict=True):
        axis.set_title(title, fontsize="small")  # as labelled: never re-wrapped mid-word
    _share_y(figure.axes)
    figure.supxlabel(caption(len(shown), len(with_data)), fontsize="small")
    return figure


def draw_overlap(panels: Sequence[tuple[str, Mapping[str, Any]]]) -> Figure | None:
    """Per step: cross-role overlap fraction (bars) and exposed bubble (line, right axis)."""
    panels = [(title, overlap_series(profile)) for title, profile in panels]
    with_data = [(t, s) for t, s in panels if any(v is not None for _, v, _ in s)]
    panels = with_data[:MAX_PROFILE_PANELS]
    if not panels:
        return None
    figure = layout.new_figure(len(panels))
    axes = layout.grid(figure, len(panels))
    twins = []
    for axis, (title, series) in zip(axes, panels, strict=True):
        steps = range(len(series))
        axis.bar(steps, [v if v is not None else 0.0 for _, v, _ in series],
                 label="overlap fraction", color="C0")
        axis.set_ylim(0.0, 1.0)
        axis.set_ylabel("overlap fraction")
        axis.set_xticks(list(steps), [step for step, _, _ in series], fontsize="small")
        axis.set_xlabel("step")
        bubble = [b if b is not None else np.nan for _, _, b in series]
        twin = axis.twinx()
        twin.plot(steps, bubble, "o-", color="C3", label="exposed bubble (s)")
        twin.set_ylabel("exposed bubble (s)")
        twin.set_ylim(bottom=0.0)
        twins.append(twin)
        axis.set_title(title, fontsize="small")
    _share_y(twins)  # one bubble axis for the figure: panels compare
    figure.supxlabel(caption(len(panels), len(with_data)), fontsize="small")
    layout.figure_legend(figure, [a for axis in axes for a in (axis, *axis.get_shared_x_axes()
                                                                .get_siblings(axis))])
    return figure


def _result_panels(results: Sequence[LoadedResult]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(case_label(r.case_id, r.policy), profile) for r in results
            if (profile := result_profile(r.doc)) is not None]


def draw_result_layers(results: Sequence[LoadedResult]) -> Figure | None:
    return draw_layers(_result_panels(results))


def draw_result_overlap(results: Sequence[LoadedResult]) -> Figure | None:
    return draw_overlap(_result_panels(results))


def save_profile_plots(profile: Mapping[str, Any], directory: Path) -> list[Path]:
    """The per-layer and overlap PNGs of one profile; only those with data are written."""
    written = []
    for name, draw in ((LAYERS_PLOT, draw_layers), (OVERLAP_PLOT, draw_overlap)):
        figure = draw([("profile", profile)])
        if figure is not None:
            path = layout.save(figure, Path(directory) / f"{name}.png")
            if path is not None:
                written.append(path)
    return written
