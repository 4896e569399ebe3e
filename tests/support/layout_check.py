"""A layout check on a drawn matplotlib figure, from the text extents after drawing.

Kept apart from the report's own layout code (an independent judge): it
collects every visible tick label, axis label, title, annotation and legend
box, and reports pairs that overlap, text cut off at the figure's edge, legends
over an axes' data area, and axes below a minimum size.
"""

from itertools import combinations

from matplotlib.backends.backend_agg import FigureCanvasAgg

MIN_AXES_WIDTH_IN = 1.5
MIN_AXES_HEIGHT_IN = 1.0
# Boxes that only touch are not an overlap: shrink each by this many pixels first.
TOUCH_TOLERANCE_PX = 1.0


def _shrunk(box):
    return box.expanded(1, 1).padded(-TOUCH_TOLERANCE_PX)


def _is_colorbar(axis):
    return axis.get_label() == "<colorbar>"


def _drawn_tick_labels(axis_side):
    """Tick labels matplotlib draws: visible ones whose tick lies inside the view limits."""
    low, high = sorted(axis_side.get_view_interval())
    slack = (high - low) * 1e-9
    ticks = zip(axis_side.get_major_ticks(), axis_side.get_majorticklocs(), strict=False)
    return [
        tick.label1
        for tick, loc in ticks
        if low - slack <= loc <= high + slack
        and tick.label1.get_visible()
        and tick.label1.get_text().strip()
    ]


def _texts(figure, renderer):
    """(description, window extent) of every visible, non-empty text element and legend."""
    found = []
    for axis in figure.axes:
        where = axis.get_title() or axis.get_label() or "axes"
        for name, side in (("x", axis.xaxis), ("y", axis.yaxis)):
            for label in _drawn_tick_labels(side):
                found.append((f"{where}: {name} tick {label.get_text()!r}", label))
        for label in (axis.xaxis.label, axis.yaxis.label, axis.title):
            if label.get_visible() and label.get_text().strip():
                found.append((f"{where}: label {label.get_text()!r}", label))
        for text in axis.texts:
            if text.get_visible() and text.get_text().strip():
                found.append((f"{where}: annotation {text.get_text()!r}", text))
        if axis.get_legend() is not None:
            found.append((f"{where}: legend", axis.get_legend()))
    for index, legend in enumerate(figure.legends):
        found.append((f"figure legend {index}", legend))
    if figure._suptitle is not None and figure._suptitle.get_text():
        found.append(("suptitle", figure._suptitle))
    return [(name, artist.get_window_extent(renderer)) for name, artist in found]


def layout_problems(figure):
    """Every layout defect of ``figure``; empty when it reads well."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    dpi = figure.dpi
    page = figure.bbox
    problems = []
    plot_axes = [axis for axis in figure.axes if not _is_colorbar(axis)]
    for axis in plot_axes:
        box = axis.get_window_extent(renderer)
        if box.width / dpi < MIN_AXES_WIDTH_IN or box.height / dpi < MIN_AXES_HEIGHT_IN:
            problems.append(
                f"axes {axis.get_title()!r} is {box.width / dpi:.2f} x {box.height / dpi:.2f} in"
            )
    texts = _texts(figure, renderer)
    for name, box in texts:
        if (
            box.x0 < page.x0 - TOUCH_TOLERANCE_PX
            or box.x1 > page.x1 + TOUCH_TOLERANCE_PX
            or (box.y0 < page.y0 - TOUCH_TOLERANCE_PX or box.y1 > page.y1 + TOUCH_TOLERANCE_PX)
        ):
            problems.append(f"{name} is cut off at the figure's edge")
    for (first, one), (second, other) in combinations(texts, 2):
        if _shrunk(one).overlaps(_shrunk(other)):
            problems.append(f"{first} overlaps {second}")
    for name, box in texts:
        if "legend" not in name:
            continue
        for axis in plot_axes:
            if _shrunk(box).overlaps(_shrunk(axis.get_window_extent(renderer))):
                problems.append(f"{name} covers the data of axes {axis.get_title()!r}")
    return problems
