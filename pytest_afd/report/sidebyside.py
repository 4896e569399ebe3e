"""Side-by-side bars of two measured sides per case (A vs B, AFD vs PP), min-max bars.

One horizontal row per case and a panel per metric; the figure grows with the
cases; each row's ratio verdict (from the caller) is part of its label.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pytest_afd.report import layout
from pytest_afd.report.values import throughput, ttft_of

BAR_HEIGHT = 0.38
X_TICKS = 4
SIDE_PANELS: tuple[tuple[str, Callable[[Mapping[str, Any]], Any]], ...] = (
    ("prefill throughput (tokens/s)", throughput),
    ("TTFT p50 (s)", lambda doc: ttft_of(doc, "p50")),
)


def draw_side_by_side(
    rows: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]],
    side_names: tuple[str, str],
    title: str,
) -> Figure | None:
    """``rows``: (label, left doc, right doc). None when no side has a measurement."""
    if not rows:
        return None
    labels = [layout.wrap(label) for label, _, _ in rows]
    slot_in = max(
        2 * layout.LINE_HEIGHT_IN, max(map(layout.line_count, labels)) * layout.LINE_HEIGHT_IN
    )
    height = max(layout.MIN_AXES_HEIGHT_IN, len(rows) * slot_in) + layout.FRAME_HEIGHT_IN
    figure = Figure(
        figsize=(layout.PANEL_WIDTH_IN * len(SIDE_PANELS), height),
        dpi=layout.FIGURE_DPI,
        layout="constrained",
    )
    axes = layout.grid(figure, len(SIDE_PANELS), columns=len(SIDE_PANELS))
    for column, (axis, (metric, read)) in enumerate(zip(axes, SIDE_PANELS, strict=True)):
        for side, offset in ((0, -BAR_HEIGHT / 2), (1, BAR_HEIGHT / 2)):
            placed = [(index + offset, read(row[1 + side])) for index, row in enumerate(rows)]
            layout.spread_bars(axis, placed, height=BAR_HEIGHT, label=side_names[side],
                               color=f"C{side}")
        axis.set_title(metric, fontsize="small")
        axis.set_yticks(range(len(rows)))
        if column == 0:
            axis.set_yticklabels(labels, fontsize="small")
        else:
            axis.set_yticklabels([])
        axis.set_ylim(len(rows) - 0.5, -0.5)
        axis.xaxis.set_major_locator(MaxNLocator(nbins=X_TICKS))
        axis.tick_params(axis="x", labelsize="small")
    if not layout.has_data(figure):
        return None
    figure.suptitle(layout.wrap(title, layout.TITLE_WRAP_CHARS * 2), fontsize="small")
    layout.figure_legend(figure, axes, where="lower center")
    return figure
