"""Point plots whose points must be matchable: imbalance vs step time, and prefix-cache hits.

Imbalance: every point carries a number that the report's key table below the
figure lists (condition, policy, imbalance, step time), so a point whose
number had to be dropped for lack of room is still found by its values; the
key outliers (slowest, fastest, most imbalanced) get their whole label first.
Hit ratio: cold and steady-state runs have their own markers, and each point
says the ratio it realized (a cold run that asked for 25 % and realized 0 %
sits at 0 %, labelled so).
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from pytest_afd.report import layout
from pytest_afd.report.loading import LoadedResult
from pytest_afd.report.values import (
    PERCENT,
    condition_labels,
    hit_ratios,
    mean_imbalance,
    median_of,
    spread_of,
    step_time_s,
    step_time_spread,
    throughput,
)

ERROR_CAPSIZE = layout.ERROR_CAPSIZE
PHASE_MARKERS = {"cold": "o", "steady": "s"}
OTHER_PHASE_MARKER = "^"
NO_PHASE = "-"


# --- imbalance vs step time ------------------------------------------------------------------
def imbalance_points(results: Sequence[LoadedResult]) -> list[tuple[int, LoadedResult, float, float]]:
    """(number, result, mean imbalance, step time) per split case, numbered in key order."""
    labels = condition_labels(results)
    points = [(r, mean_imbalance(r.doc), step_time_s(r.doc)) for r in results]
    ordered = sorted(
        ((r, x, y) for r, x, y in points if x is not None and y is not None),
        key=lambda item: (labels[item[0].case_id], item[0].policy, item[0].case_id),
    )
    return [(number, r, x, y) for number, (r, x, y) in enumerate(ordered, start=1)]


def key_outliers(points: Sequence[tuple[int, LoadedResult, float, float]]) -> list[int]:
    """Numbers of the slowest, the fastest and the most imbalanced point (each once)."""
    if not points:
        return []
    picks = [
        max(points, key=lambda p: p[3]),
        min(points, key=lambda p: p[3]),
        max(points, key=lambda p: p[2]),
    ]
    return list(dict.fromkeys(p[0] for p in picks))


def draw_imbalance_vs_step_time(results: Sequence[LoadedResult]) -> Figure | None:
    """One numbered point per split case; outliers labelled in full, numbers where they fit."""
    points = imbalance_points(results)
    if not points:
        return None
    labels = condition_labels(results)
    figure = layout.new_figure(1, height_in=layout.PANEL_HEIGHT_IN * 1.5)
    figure.set_figwidth(layout.PANEL_WIDTH_IN * 2)
    (axis,) = layout.grid(figure, 1)
    for index, policy in enumerate(sorted({r.policy for _, r, _, _ in points})):
        mine = [(r, x, y) for _, r, x, y in points if r.policy == policy]
        spreads = [step_time_spread(r.doc) for r, _, _ in mine]
        axis.errorbar(
            [x * PERCENT for _, x, _ in mine],
            [y for _, _, y in mine],
            yerr=[[low for low, _ in spreads], [high for _, high in spreads]],
            fmt="o",
            capsize=ERROR_CAPSIZE,
            label=policy,
            color=f"C{index}",
        )
    axis.margins(x=0.08, y=0.12)
    axis.set_xlabel("realized ubatch token imbalance, mean over steps (%)")
    axis.set_ylabel("forward step time (s)")
    axis.set_title("imbalance vs step time (bars: min-max; numbers: key below)", fontsize="small")
    layout.figure_legend(figure, [axis])
    outliers = key_outliers(points)
    by_number = {p[0]: p for p in points}
    texts: list[tuple[float, float, str | tuple[str, ...]]] = [
        (x * PERCENT, y, (layout.shorten(f"{n}: {labels[r.case_id]} / {r.policy}"), str(n)))
        for n, r, x, y in (by_number[n] for n in outliers)
    ]
    texts += [(x * PERCENT, y, str(n)) for n, _, x, y in points if n not in outliers]
    layout.place_point_labels(figure, axis, texts)
    return figure


def imbalance_key(results: Sequence[LoadedResult]) -> list[list[str]]:
    """Rows of the key table: number, condition, policy, imbalance, step time, outlier."""
    points = imbalance_points(results)
    labels = condition_labels(results)
    outliers = set(key_outliers(points))
    return [
        [str(n), labels[r.case_id], r.policy, f"{x * PERCENT:.1f}%", f"{y:.4g}",
         "key outlier" if n in outliers else ""]
        for n, r, x, y in points
    ]


# --- prefix-cache hit ratio --------------------------------------------------------------------
def phase_of(result: LoadedResult) -> str:
    return result.doc["settings"]["prefix_cache"].get("phase", NO_PHASE)


def draw_hit_ratio(results: Sequence[LoadedResult]) -> Figure | None:
    """Realized vs requested hit ratio, and throughput vs realized ratio, per policy and phase."""
    points = []
    for result in results:
        requested, realized = hit_ratios(result.doc)
        if requested is not None and realized is not None:
            points.append((result, requested, realized))
    if len({requested for _, requested, _ in points}) < 2:  # noqa: PLR2004 - a sweep
        return None
    figure = layout.new_figure(2, height_in=layout.PANEL_HEIGHT_IN * 1.3)
    ratio_axis, rate_axis = layout.grid(figure, 2)
    ratio_axis.plot([0, PERCENT], [0, PERCENT], color="grey", linestyle="--",
                    gid=layout.REFERENCE_GID, label="realized = requested")
    policies = sorted({r.policy for r, _, _ in points})
    phases = sorted({phase_of(r) for r, _, _ in points})
    for index, policy in enumerate(policies):
        for phase in phases:
            mine = [(r, req, real) for r, req, real in points
                    if r.policy == policy and phase_of(r) == phase]
            if not mine:
                continue
            name = policy if phase == NO_PHASE else f"{policy}, {phase}"
            marker = PHASE_MARKERS.get(phase, OTHER_PHASE_MARKER)
            hollow = {"facecolors": "none"} if phase == "cold" else {}
            ratio_axis.scatter([req * PERCENT for _, req, _ in mine],
                               [real * PERCENT for _, _, real in mine],
                               label=name, color=f"C{index}", marker=marker,
                               edgecolors=f"C{index}", **hollow)
            measured = [(real, median_of(throughput(r.doc)), spread_of(throughput(r.doc)))
                        for r, _, real in mine]
            measured = [(x, y, e) for x, y, e in measured if y is not None and e is not None]
            if measured:
                rate_axis.errorbar(
                    [x * PERCENT for x, _, _ in measured], [y for _, y, _ in measured],
                    yerr=[[e[0] for _, _, e in measured], [e[1] for _, _, e in measured]],
                    fmt=marker, capsize=ERROR_CAPSIZE, label=name, color=f"C{index}",
                    markerfacecolor="none" if phase == "cold" else f"C{index}",
                )
    ratio_axis.set_xlabel("requested hit ratio (%)")
    ratio_axis.set_ylabel("realized hit ratio (%)")
    ratio_axis.set_title("realized vs requested hits (hollow: cold)", fontsize="small")
    rate_axis.set_xlabel("realized hit ratio (%)")
    rate_axis.set_ylabel("prefill throughput (tokens/s)")
    rate_axis.set_title("throughput vs realized hits (min-max)", fontsize="small")
    layout.figure_legend(figure, [ratio_axis, rate_axis])
    misses = [(req * PERCENT, real * PERCENT, f"realized {real:.0%} ({phase_of(r)})")
              for r, req, real in points if abs(req - real) * PERCENT >= 1]
    layout.place_point_labels(figure, ratio_axis, misses)
    return figure
