"""Per-stack plots: each ``draw_*`` returns a Figure, or None when there is nothing to draw.

Layout rules (pytest_afd.report.layout): short condition labels, never node
ids; figures grow with their rows; legends outside the data; series named by
what differs between them (routing, model, layers).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pytest_afd.report import layout
from pytest_afd.report.loading import LoadedResult
from pytest_afd.report.point_plots import draw_hit_ratio, draw_imbalance_vs_step_time
from pytest_afd.report.profile_plots import draw_result_layers, draw_result_overlap
from pytest_afd.report.values import (
    FORCED_ROUTING,
    UNCHUNKED_LABEL,
    chunk_label,
    chunk_sort_key,
    chunk_validity,
    condition_labels,
    expert_routing,
    median_of,
    natural_key,
    normalised_expert_heat,
    per_layer_components,
    per_layer_rank_skew,
    spread_of,
    throughput,
    ttft_of,
)

MAX_PANELS = 6
# The layer breakdown shows every instrumented case up to this many panels.
MAX_LAYER_PANELS = 24
# Conditions drawn in the policy plot (3 rows of 30); the case table lists every one.
MAX_CONDITIONS_SHOWN = 90
# Conditions per row of the policy plot; more go to further rows (small multiples).
MAX_CONDITIONS_PER_ROW = 30
BAR_HEIGHT_IN = 0.16
CONDITION_GAP = 0.2  # share of a condition's slot left empty between groups
ERROR_CAPSIZE = layout.ERROR_CAPSIZE
INVALID_MARKER_Y = 0.0
X_TICKS = 4
TTFT_P99_TITLE = "TTFT p99 (s)"
METRIC_PANELS = (
    ("prefill throughput (tokens/s)", throughput),
    ("TTFT p50 (s)", lambda doc: ttft_of(doc, "p50")),
    (TTFT_P99_TITLE, lambda doc: ttft_of(doc, "p99")),
)


def policies_of(results: Sequence[LoadedResult]) -> list[str]:
    return sorted({r.policy for r in results})


def series_key(result: LoadedResult) -> tuple[str, str, int]:
    """What can tell two expert-load series apart: routing, model name, layer count."""
    manifest_model = result.doc["manifest"]["model"]
    layers = len(result.doc["evidence"]["expert_load"]["per_expert"])
    return expert_routing(result.doc), manifest_model["name"], layers


def series_labels(keys: Sequence[tuple[str, str, int]]) -> dict[tuple[str, str, int], str]:
    """Each key named by the parts that vary (routing always; model, layers when they differ)."""
    models = {key[1] for key in keys}
    layer_counts = {key[2] for key in keys}
    labels = {}
    for routing, model, layers in keys:
        parts = [routing + (" (synthetic)" if routing == FORCED_ROUTING else "")]
        if len(models) > 1:
            parts.append(model)
        if len(layer_counts) > 1 or len(models) > 1:
            parts.append(f"{layers} MoE layers")
        labels[(routing, model, layers)] = ", ".join(parts)
    return labels


# --- throughput and TTFT per condition and policy ----------------------------------------
def _bars(
    axis: Any,
    results: Sequence[LoadedResult],
    conditions: Sequence[str],
    read: Callable,
    labels: Mapping[str, str],
    policies: Sequence[str],
) -> None:
    width = (1 - CONDITION_GAP) / len(policies)
    for offset, policy in enumerate(policies):
        shift = (offset - (len(policies) - 1) / 2) * width
        placed = [
            (index + shift, read(result.doc))
            for index, condition in enumerate(conditions)
            for result in results
            if result.policy == policy and labels[result.case_id] == condition
        ]
        layout.spread_bars(axis, placed, height=width, label=policy, color=f"C{offset}")


def draw_policy_metrics(results: Sequence[LoadedResult]) -> Figure | None:
    """Horizontal bars per condition, one per policy, min-max over repetitions; rows of <= 30."""
    if not any(median_of(read(r.doc)) is not None for r in results for _, read in METRIC_PANELS):
        return None
    labels = condition_labels(results)
    conditions = sorted(set(labels.values()), key=natural_key)[:MAX_CONDITIONS_SHOWN]
    policies = policies_of(results)
    panels = metric_panels(results)
    chunks = [
        conditions[i : i + MAX_CONDITIONS_PER_ROW]
        for i in range(0, len(conditions), MAX_CONDITIONS_PER_ROW)
    ]
    wrapped = {c: layout.wrap(c) for c in conditions}
    slot_in = max(
        len(policies) * BAR_HEIGHT_IN / (1 - CONDITION_GAP),
        max(layout.line_count(text) for text in wrapped.values()) * layout.LINE_HEIGHT_IN,
    )
    heights = [max(layout.MIN_AXES_HEIGHT_IN, len(chunk) * slot_in) for chunk in chunks]
    figure = Figure(
        figsize=(
            layout.PANEL_WIDTH_IN * len(panels),
            sum(heights) + layout.FRAME_HEIGHT_IN * len(chunks),
        ),
        dpi=layout.FIGURE_DPI,
        layout="constrained",
    )
    spec = figure.add_gridspec(len(chunks), len(panels), height_ratios=heights)
    axes = []
    for row, chunk in enumerate(chunks):
        first = None
        for column, (title, read) in enumerate(panels):
            axis = figure.add_subplot(spec[row, column], sharey=first)
            first = first or axis
            _bars(axis, results, chunk, read, labels, policies)
            axis.set_title(title, fontsize="small")
            axis.xaxis.set_major_locator(MaxNLocator(nbins=X_TICKS))
            axis.tick_params(axis="x", labelsize="small")
            axis.set_yticks(range(len(chunk)))
            if column == 0:
                axis.set_yticklabels([wrapped[c] for c in chunk], fontsize="small")
            else:
                axis.tick_params(axis="y", labelleft=False)
            axis.set_ylim(len(chunk) - 0.5, -0.5)  # first condition on top
            axes.append(axis)
    layout.figure_legend(figure, axes)
    return figure


def tails_repeat_median(results: Sequence[LoadedResult]) -> bool:
    """True when every measured case's TTFT p99 equals its p50 (all requests arrive at once:
    every first token comes out of the same prefill, so the tail percentiles repeat p50)."""
    pairs = [(median_of(ttft_of(r.doc, "p50")), median_of(ttft_of(r.doc, "p99"))) for r in results]
    pairs = [(p50, p99) for p50, p99 in pairs if p50 is not None and p99 is not None]
    return bool(pairs) and all(np.isclose(p50, p99) for p50, p99 in pairs)


def metric_panels(results: Sequence[LoadedResult]) -> tuple:
    """The panels worth drawing: TTFT p99 only when it says something p50 does not."""
    if tails_repeat_median(results):
        return tuple(panel for panel in METRIC_PANELS if panel[0] != TTFT_P99_TITLE)
    return METRIC_PANELS


def instrumented_cases(results: Sequence[LoadedResult]) -> int:
    return sum(bool(per_layer_components(r.doc)) for r in results)


def plot_note(name: str, results: Sequence[LoadedResult]) -> str:
    """What a plot leaves out, for its caption (rows capped, repeated percentiles)."""
    notes = []
    if name == "policy_metrics":
        conditions = len(set(condition_labels(results).values()))
        if conditions > MAX_CONDITIONS_SHOWN:
            notes.append(f"the first {MAX_CONDITIONS_SHOWN} of {conditions} conditions; "
                         "the case table lists every one")
        if tails_repeat_median(results):
            notes.append("TTFT p99 not drawn: it equals p50 in every case (all requests arrive "
                         "at once, so every first token comes from the same prefill)")
    if name == "layer_breakdown":
        cases = instrumented_cases(results)
        shown = min(cases, MAX_LAYER_PANELS)
        notes.append(f"{shown} of {cases} instrumented case(s)"
                     + (f" of {len(results)} in this stack" if cases < len(results) else ""))
    return "".join(f"; {note}" for note in notes)


# --- instrumented per-layer breakdown ------------------------------------------------------
def draw_layer_breakdown(results: Sequence[LoadedResult]) -> Figure | None:
    labels = condition_labels(results)
    cases = [(r, per_layer_components(r.doc)) for r in results]
    cases = [(r, layers) for r, layers in cases if layers]
    if not cases:
        return None
    shown = cases[:MAX_LAYER_PANELS]
    return layout.layer_bar_panels(
        [(f"{labels[result.case_id]} / {result.policy}", layers) for result, layers in shown],
        ylabel="time (s)")


# --- expert load -----------------------------------------------------------------------------
def draw_expert_heat(results: Sequence[LoadedResult]) -> Figure | None:
    """Mean normalised expert heat per series (routing, model, layers), one colour scale."""
    groups: dict[tuple[str, str, int], list[np.ndarray]] = defaultdict(list)
    for result in results:
        heat = normalised_expert_heat(result.doc)
        if heat is not None:
            groups[series_key(result)].append(heat)
    if not groups:
        return None
    names = series_labels(list(groups))
    shown = sorted(groups.items())[:MAX_PANELS]
    figure = layout.new_figure(len(shown))
    axes = layout.grid(figure, len(shown))
    means = [np.mean(heats, axis=0) for _, heats in shown]
    top = max(float(m.max()) for m in means)
    for axis, ((key, heats), mean) in zip(axes, zip(shown, means, strict=True), strict=True):
        image = axis.imshow(
            mean, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0.0, vmax=top
        )
        axis.set_title(
            layout.wrap(f"{names[key]}: {len(heats)} case(s)", layout.TITLE_WRAP_CHARS),
            fontsize="small",
        )
        axis.set_xlabel(f"expert (of {mean.shape[1]})")
        axis.set_ylabel("MoE layer")
    figure.colorbar(image, ax=axes, label="tokens / layer mean")
    return figure


def draw_rank_skew(results: Sequence[LoadedResult]) -> Figure | None:
    """Mean per-layer EP-rank skew per series, min-max over cases."""
    groups: dict[tuple[str, str, int], list[list[float]]] = defaultdict(list)
    for result in results:
        skew = per_layer_rank_skew(result.doc)
        if skew is not None:
            groups[series_key(result)].append(skew)
    if not groups:
        return None
    names = series_labels(list(groups))
    figure = layout.new_figure(1, columns=1, height_in=layout.PANEL_HEIGHT_IN * 1.2)
    figure.set_figwidth(layout.PANEL_WIDTH_IN * 2)
    (axis,) = layout.grid(figure, 1)
    for key, skews in sorted(groups.items()):
        matrix = np.asarray(skews)
        mean = matrix.mean(axis=0)
        axis.errorbar(
            range(matrix.shape[1]),
            mean,
            # Clipped at 0: equal skews leave float rounding (mean - min = -1e-16).
            yerr=[np.maximum(mean - matrix.min(axis=0), 0), np.maximum(matrix.max(axis=0) - mean, 0)],
            marker="o",
            markersize=3,
            capsize=ERROR_CAPSIZE,
            label=f"{names[key]}, {len(skews)} case(s)",
        )
    axis.axhline(1.0, color="grey", linestyle="--", gid=layout.REFERENCE_GID)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("MoE layer")
    axis.set_ylabel("EP-rank load max / mean")
    axis.set_title("rank skew per layer (bars: min-max over cases)", fontsize="small")
    layout.figure_legend(figure, [axis])
    return figure


# --- chunk sweep and prefix-cache hits -------------------------------------------------------
def draw_chunk_sweep(results: Sequence[LoadedResult]) -> Figure | None:
    """Throughput per chunk size, one line per dataset (and policy); invalid sizes marked x."""
    sizes = sorted({chunk_label(r.doc) for r in results}, key=chunk_sort_key)
    if len(sizes) < 2:  # noqa: PLR2004 - a sweep needs two sizes
        return None
    figure = layout.new_figure(1, columns=1, height_in=layout.PANEL_HEIGHT_IN * 1.2)
    figure.set_figwidth(layout.PANEL_WIDTH_IN * 2)
    (axis,) = layout.grid(figure, 1)
    series: dict[str, list[LoadedResult]] = defaultdict(list)
    several_policies = len(policies_of(results)) > 1
    for result in results:
        name = f"{result.dataset} / {result.policy}" if several_policies else result.dataset
        series[name].append(result)
    invalid_drawn = False
    for name, members in sorted(series.items()):
        xs, ys, low, high = [], [], [], []
        for result in sorted(members, key=lambda r: chunk_sort_key(chunk_label(r.doc))):
            x = sizes.index(chunk_label(result.doc))
            if not chunk_validity(result.doc)[0]:
                axis.scatter(
                    [x],
                    [INVALID_MARKER_Y],
                    marker="x",
                    color="red",
                    s=80,
                    zorder=3,
                    label=None if invalid_drawn else "invalid size (omitted)",
                )
                invalid_drawn = True
                continue
            value, spread = median_of(throughput(result.doc)), spread_of(throughput(result.doc))
            if value is None or spread is None:
                continue
            xs.append(x)
            ys.append(value)
            low.append(spread[0])
            high.append(spread[1])
        if xs:
            drawn = axis.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=ERROR_CAPSIZE,
                                  label=name)
            reference_x = sizes.index(UNCHUNKED_LABEL) if UNCHUNKED_LABEL in sizes else None
            if reference_x in xs:
                # The reference across the sweep: a chunk size above the line beats it.
                reference = ys[xs.index(reference_x)]
                axis.axhline(reference, color=drawn[0].get_color(), linestyle=":",
                             linewidth=1, gid=layout.REFERENCE_GID)
    if not layout.has_data(figure):
        return None
    axis.set_xticks(range(len(sizes)))
    axis.set_xticklabels(sizes, fontsize="small")
    axis.set_xlabel("chunk size (tokens)")
    axis.set_ylabel("prefill throughput (tokens/s)")
    axis.set_title("chunk-size sweep (bars: min-max; dotted: each line's unchunked reference)",
                   fontsize="small")
    layout.figure_legend(figure, [axis])
    return figure


PLOTTERS = (
    (
        "policy_metrics",
        "TTFT and throughput per condition and policy (bars: min-max over repetitions)",
        draw_policy_metrics,
    ),
    (
        "imbalance_vs_step_time",
        "Realized imbalance vs forward step time (labels where they fit)",
        draw_imbalance_vs_step_time,
    ),
    ("layer_breakdown", "Per-layer time breakdown (instrumented runs)", draw_layer_breakdown),
    ("profile_layers", "Per-layer components from profiler traces (instrumented runs; "
     "docs/profiling.md)", draw_result_layers),
    ("profile_overlap", "Per-step Attention/FFN overlap and exposed bubble from profiler traces",
     draw_result_overlap),
    ("expert_heat", "Expert heat per layer (tokens / layer mean)", draw_expert_heat),
    ("rank_skew", "EP-rank skew per layer (max / mean routed tokens)", draw_rank_skew),
    ("chunk_sweep", "Chunk-size sweep (invalid sizes marked x)", draw_chunk_sweep),
    ("hit_ratio", "Prefix-cache hit ratio: realized vs requested, and throughput", draw_hit_ratio),
)
