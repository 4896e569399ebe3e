"""Figure layout that stays readable from 1 to 100+ cases.

Figures grow with the number of rows they show instead of squeezing them;
labels are wrapped to a fixed width; legends sit outside the data, above the
axes; point labels are kept only where they collide with nothing and stay
inside the axes. :func:`save` writes nothing for a figure without data.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pytest_afd.report.values import median_of, spread_of

FIGURE_DPI = 100
PANEL_WIDTH_IN = 4.5
PANEL_HEIGHT_IN = 3.5
LABEL_WRAP_CHARS = 28
TITLE_WRAP_CHARS = 48
# Height per wrapped tick-label line at fontsize "small" (9 pt, with leading).
LINE_HEIGHT_IN = 0.17
# Room for titles, x tick labels, axis labels and the legend above the axes.
FRAME_HEIGHT_IN = 1.6
MIN_AXES_HEIGHT_IN = 1.8
LEGEND_COLUMNS = 4
# Legend entry width at fontsize "small": per character, plus the handle and padding.
LEGEND_CHAR_WIDTH_IN = 0.08
LEGEND_HANDLE_IN = 0.8
# Artists with this gid are reference lines, not data (a figure of only those is empty).
REFERENCE_GID = "reference"
POINT_LABEL_OFFSET_PT = (3, 3)
POINT_LABEL_CHARS = 32


def wrap(text: str, width: int = LABEL_WRAP_CHARS) -> str:
    """Wrap at spaces; break long words too, so no label is wider than ``width``."""
    return "\n".join(textwrap.wrap(text, width=width, break_long_words=True)) or text


def shorten(text: str, width: int = POINT_LABEL_CHARS) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def line_count(text: str) -> int:
    return text.count("\n") + 1


def new_figure(panels: int, *, columns: int = 3, height_in: float = PANEL_HEIGHT_IN) -> Figure:
    columns = max(1, min(panels, columns))
    rows = -(-panels // columns)
    return Figure(
        figsize=(PANEL_WIDTH_IN * columns, height_in * rows),
        dpi=FIGURE_DPI,
        layout="constrained",
    )


def grid(figure: Figure, panels: int, columns: int = 3, **kwargs: Any) -> list[Any]:
    columns = max(1, min(panels, columns))
    rows = -(-panels // columns)
    return [figure.add_subplot(rows, columns, i + 1, **kwargs) for i in range(panels)]


def figure_legend(figure: Figure, axes: Sequence[Any], where: str = "upper center") -> None:
    """One legend for the figure, outside the axes (never over data); deduplicated labels."""
    handles: dict[str, Any] = {}
    for axis in axes:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        widest = max(len(label) for label in handles) * LEGEND_CHAR_WIDTH_IN + LEGEND_HANDLE_IN
        fitting = max(1, int(figure.get_figwidth() // widest))
        figure.legend(
            list(handles.values()),
            list(handles),
            loc=f"outside {where}",
            ncols=min(LEGEND_COLUMNS, len(handles), fitting),
            fontsize="small",
        )


def has_data(figure: Figure) -> bool:
    """True when some axes draws a line, bar, point or image that is not a reference line."""
    for axis in figure.axes:
        artists = [*axis.lines, *axis.patches, *axis.collections, *axis.images]
        if any(artist.get_gid() != REFERENCE_GID for artist in artists):
            return True
    return False


def place_point_labels(
    figure: Figure, axis: Any, points: Sequence[tuple[float, float, str | Sequence[str]]]
) -> int:
    """Annotate points greedily; drop a label that overlaps a kept one or leaves the axes.

    A point may offer several texts, longest first: the first that fits is kept
    (a full label, else its number). Returns how many labels were kept. Uses
    the text extents after drawing.
    """
    canvas = FigureCanvasAgg(figure)
    figure.draw_without_rendering()  # final layout, so extents are where they will be
    renderer = canvas.get_renderer()
    box = axis.get_window_extent(renderer)
    # Every point's position on the canvas: a label must not cover another point.
    marks = axis.transData.transform([(x, y) for x, y, _ in points])
    kept: list[Any] = []
    for index, (x, y, texts) in enumerate(points):
        for text in [texts] if isinstance(texts, str) else texts:
            note = axis.annotate(
                text,
                (x, y),
                fontsize="x-small",
                xytext=POINT_LABEL_OFFSET_PT,
                textcoords="offset points",
            )
            note.set_in_layout(False)  # point labels never shrink the axes
            extent = note.get_window_extent(renderer)
            inside = (
                extent.x0 >= box.x0
                and extent.x1 <= box.x1
                and extent.y0 >= box.y0
                and extent.y1 <= box.y1
            )
            covers = any(
                extent.contains(mx, my) for other, (mx, my) in enumerate(marks) if other != index
            )
            if not inside or covers or any(extent.overlaps(other) for other in kept):
                note.remove()
                continue
            kept.append(extent)
            break
    return len(kept)


def save(figure: Figure, path: Path) -> Path | None:
    """Write the PNG; None (nothing written) when the figure has no data."""
    if not has_data(figure):
        return None
    FigureCanvasAgg(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


ERROR_CAPSIZE = 3


def spread_bars(axis: Any, placed: Sequence[tuple[float, Any]], *, height: float, label: str,
                color: str) -> None:
    """Horizontal bars at each measurement's median, min-max error bars; unmeasured ones left out."""
    positions, values, low, high = [], [], [], []
    for position, measure in placed:
        value, spread = median_of(measure), spread_of(measure)
        if value is None or spread is None:
            continue
        positions.append(position)
        values.append(value)
        low.append(spread[0])
        high.append(spread[1])
    if values:
        axis.barh(positions, values, height=height, xerr=[low, high], capsize=ERROR_CAPSIZE,
                  label=label, color=color)


COLOR_CYCLE = 10  # matplotlib's default colour cycle "C0".."C9"


def layer_bar_panels(panels: Sequence[tuple[str, Sequence[dict[str, float]]]], *,
                     ylabel: str) -> Figure:
    """One panel per (title, layers): per layer, its components' seconds stacked, one
    colour per component across panels (the report's per-layer breakdowns)."""
    figure = new_figure(len(panels))
    axes = grid(figure, len(panels))
    names = sorted({name for _, layers in panels for layer in layers for name in layer})
    for axis, (title, layers) in zip(axes, panels, strict=True):
        bottom = [0.0] * len(layers)
        for index, name in enumerate(names):
            values = [float(layer.get(name, 0.0)) for layer in layers]
            axis.bar(range(len(layers)), values, bottom=bottom, label=name,
                     color=f"C{index % COLOR_CYCLE}")
            bottom = [low + value for low, value in zip(bottom, values, strict=True)]
        axis.set_title(wrap(title, TITLE_WRAP_CHARS), fontsize="small")
        axis.set_xlabel("layer")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylabel(ylabel)
    figure_legend(figure, axes)
    return figure
