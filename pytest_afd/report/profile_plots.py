"""Plots of ``evidence.profile`` (docs/profiling.md): per-layer components and per-step overlap.

Used by the report (instrumented cases) and by ``profile-summary`` (one profile).
"""

from __future__ import annotations

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
    panels = [(title, layers) for title, layers in panels if layers][:MAX_PROFILE_PANELS]
    if not panels:
        return None
    return layout.layer_bar_panels(panels, ylabel="s per step (rank mean)")


def draw_overlap(panels: Sequence[tuple[str, Mapping[str, Any]]]) -> Figure | None:
    """Per step: cross-role overlap fraction (bars) and exposed bubble (line, right axis)."""
    panels = [(title, overlap_series(profile)) for title, profile in panels]
    panels = [(t, s) for t, s in panels if any(v is not None for _, v, _ in s)]
    panels = panels[:MAX_PROFILE_PANELS]
    if not panels:
        return None
    figure = layout.new_figure(len(panels))
    axes = layout.grid(figure, len(panels))
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
        axis.set_title(layout.wrap(title, layout.TITLE_WRAP_CHARS), fontsize="small")
    layout.figure_legend(figure, [a for axis in axes for a in (axis, *axis.get_shared_x_axes()
                                                                .get_siblings(axis))])
    return figure


def _result_panels(results: Sequence[LoadedResult]) -> list[tuple[str, Mapping[str, Any]]]:
    return [(f"{r.case_id} / {r.policy}", profile) for r in results
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
