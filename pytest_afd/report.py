"""Render a results directory into a Markdown report with PNG plots.

Reads every ``afd-result`` JSON under the directory (validated against
``schemas/result.schema.json``), groups them by stage (``case_kind``) and by
stack (``manifest_digest``), and writes one table and a set of plots per
(stage, stack). Cases run on different stacks are never put in one table or
plot: the report says how many stacks there are and compares only within one.

Fields read beyond the schema's required ones (all optional, documented in
``docs/workloads.md``):

- ``metrics.step_time_s`` (a measurement) or, per step, ``wall_time_s`` (the
  CPU backend records it): forward step time; without either it is derived as
  run wall time (logical tokens / prefill tokens/s) / forward steps.
- ``evidence.per_layer_timings.layers``: a list, one mapping per layer of
  component name -> seconds, for the per-layer breakdown
  (:func:`layer_breakdown_from_tables` makes it from the AFD runtime's tables).
- ``evidence.chunk_plan``: ``SchedulePlan.to_json()`` (``valid``,
  ``reasons``); a Stage D size with ``valid: false`` is marked invalid.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pytest_afd.plugin import MARKERS
from pytest_afd.results import ResultValidationError, is_absent, validate_result

REPORT_DIR_NAME = "report"
REPORT_FILE_NAME = "report.md"
PLOTS_DIR_NAME = "plots"
RESULT_KIND = "afd-result"
STAGE_KINDS = ("stage_a", "stage_b", "stage_c", "stage_d", "stage_e", "stage_f")
OTHER_KINDS = ("gate", "benchmark", "other")
DIGEST_SHORT_CHARS = 12  # after the "sha256:" prefix
DIGEST_PREFIX = "sha256:"
UNCHUNKED_LABEL = "unchunked"
# Keep figures readable: panels beyond these are listed, not drawn.
MAX_PANELS = 6
FIGURE_DPI = 100
PANEL_WIDTH_IN = 4.5
PANEL_HEIGHT_IN = 3.5
TITLE_WRAP_CHARS = 48
BAR_GROUP_WIDTH = 0.8
ERROR_CAPSIZE = 3
PERCENT = 100.0
TTFT_PERCENTILE_KEYS = ("p50", "p90", "p95", "p99")
INVALID_MARKER_Y = 0.0
# Optional fields the report reads when a case recorded them (see the module docstring).
STEP_TIME_METRIC = "step_time_s"
STEP_WALL_TIME = "wall_time_s"
CHUNK_PLAN_KEY = "chunk_plan"
LAYERS_KEY = "layers"
TABLE_INDEX_KEYS = frozenset({"layer", "ubatch"})
# Settings that tell two cases of one stage apart besides the split policy.
CONDITION_FIELDS = ("routing", "chunk", "prefix_cache", "phase", "hit", "quant", "align")
# Stage B's cold / steady-state phase is optional in the schema (other stages have none).
NO_PHASE = "-"


@dataclass(frozen=True)
class LoadedResult:
    path: Path
    doc: Mapping[str, Any]

    @property
    def case_id(self) -> str:
        return self.doc["case_id"]

    @property
    def stage(self) -> str:
        return self.doc["case_kind"]

    @property
    def digest(self) -> str:
        return self.doc["manifest_digest"]

    @property
    def policy(self) -> str:
        return self.doc["settings"]["split_policy"]

    @property
    def dataset(self) -> str:
        return self.doc["workload"]["dataset"]["name"]


@dataclass
class LoadedResults:
    results: list[LoadedResult] = field(default_factory=list)
    # (file, reason) for files that could not be used.
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    # JSON that is not a result (the session summary, manifests): named, not an error.
    ignored: list[Path] = field(default_factory=list)


# --- loading ---------------------------------------------------------------------
def load_results(results_dir: Path, *, exclude: Path | None = None) -> LoadedResults:
    """Every valid result under ``results_dir``, except files under ``exclude`` (the report)."""
    loaded = LoadedResults()
    report_dir = (exclude or results_dir / REPORT_DIR_NAME).resolve()
    for path in sorted(results_dir.rglob("*.json")):
        if report_dir in path.resolve().parents:
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            loaded.skipped.append((path, f"unreadable JSON: {exc}"))
            continue
        if not isinstance(doc, dict) or doc.get("kind") != RESULT_KIND:
            loaded.ignored.append(path)
            continue
        try:
            validate_result(doc)
        except ResultValidationError as exc:
            first_lines = [line.strip() for line in str(exc).splitlines()[:2]]
            loaded.skipped.append((path, " ".join(first_lines)))
            continue
        loaded.results.append(LoadedResult(path=path, doc=doc))
    return loaded


# --- reading values ------------------------------------------------------------------
def _measured(value: Any) -> Mapping[str, Any] | None:
    """The stats of a schema ``measurement``; None when absent."""
    if value is None or is_absent(value):
        return None
    return value["stats"]


def median_of(value: Any) -> float | None:
    stats = _measured(value)
    return None if stats is None else float(stats["median"])


def spread_of(value: Any) -> tuple[float, float] | None:
    """(median - min, max - median): the dispersion bar of one measurement."""
    stats = _measured(value)
    if stats is None:
        return None
    return float(stats["median"] - stats["min"]), float(stats["max"] - stats["median"])


def ttft_of(doc: Mapping[str, Any], percentile: str) -> Any:
    ttft = doc["metrics"]["ttft_s"]
    return None if is_absent(ttft) else ttft[percentile]


def step_imbalances(doc: Mapping[str, Any]) -> list[float]:
    steps = doc["evidence"]["steps"]
    if is_absent(steps):
        return []
    return [float(step["imbalance"]) for step in steps if step["imbalance"] is not None]


def mean_imbalance(doc: Mapping[str, Any]) -> float | None:
    values = step_imbalances(doc)
    return float(np.mean(values)) if values else None


def step_time_s(doc: Mapping[str, Any]) -> float | None:
    """Forward step time, from the best record available.

    In order: ``metrics.step_time_s`` (median over repetitions); the mean of the
    steps' ``wall_time_s`` (representative run) when every step carries it; else
    run wall time (logical tokens / median prefill tokens/s) / forward steps.
    """
    metrics = doc["metrics"]
    if STEP_TIME_METRIC in metrics:
        return median_of(metrics[STEP_TIME_METRIC])
    steps = doc["evidence"]["steps"]
    if is_absent(steps) or not steps:
        return None
    if all(STEP_WALL_TIME in step for step in steps):
        return float(np.mean([step[STEP_WALL_TIME] for step in steps]))
    tokens = doc["evidence"]["tokens"]
    throughput = median_of(metrics["prefill_tokens_per_s"])
    if is_absent(tokens) or not throughput:
        return None
    return tokens["logical_prompt_tokens"] / throughput / len(steps)


def rank_skew(doc: Mapping[str, Any]) -> float | None:
    """Worst layer's max/mean routed tokens over EP ranks (1.0 = balanced)."""
    skews = per_layer_rank_skew(doc)
    return max(skews) if skews else None


def hit_ratios(doc: Mapping[str, Any]) -> tuple[float | None, float | None]:
    prefix = doc["evidence"]["prefix_cache"]
    if is_absent(prefix):
        return None, None
    requested, realized = prefix["requested_hit_ratio"], prefix["realized_hit_ratio"]
    return (
        None if is_absent(requested) else float(requested),
        None if is_absent(realized) else float(realized),
    )


def chunk_label(doc: Mapping[str, Any]) -> str:
    chunk = doc["settings"]["chunked_prefill"]
    return str(chunk["chunk_size"]) if chunk["enabled"] else UNCHUNKED_LABEL


def chunk_validity(doc: Mapping[str, Any]) -> tuple[bool, str]:
    """(valid, reason) from ``evidence.chunk_plan`` when the case recorded one."""
    evidence = doc["evidence"]
    if CHUNK_PLAN_KEY not in evidence or is_absent(evidence[CHUNK_PLAN_KEY]):
        return True, ""
    plan = evidence[CHUNK_PLAN_KEY]
    return bool(plan["valid"]), "; ".join(plan["reasons"])


def condition_values(doc: Mapping[str, Any]) -> dict[str, str]:
    """The settings besides the split policy that define a case's condition."""
    settings = doc["settings"]
    requested, _ = hit_ratios(doc)
    return {
        "routing": settings["expert_balancing"]["routing"],
        "chunk": chunk_label(doc),
        "prefix_cache": "on" if settings["prefix_cache"]["enabled"] else "off",
        "phase": settings["prefix_cache"].get("phase", NO_PHASE),
        "hit": "-" if requested is None else f"{requested * PERCENT:.0f}%",
        "quant": settings["quantization"],
        "align": align_label(settings["split_constraints"]["split_align"]),
    }


def align_label(split_align) -> str:
    """An explicit alignment, or "topology" when the run took the topology's layout."""
    return "topology" if is_absent(split_align) else str(split_align)


def case_id_prefix(results: Sequence[LoadedResult]) -> str:
    """The path-like prefix every case id of a stack shares (pytest node ids are long)."""
    ids = [r.case_id for r in results]
    if len(ids) < 2:  # noqa: PLR2004 - one case keeps its whole id
        return ""
    shortest = min(ids, key=len)
    common = next(
        (shortest[:i] for i, char in enumerate(shortest) if any(x[i] != char for x in ids)),
        shortest,
    )
    cut = max(common.rfind("/"), common.rfind("::") + 1)
    return common[: cut + 1] if cut >= 0 else ""


def short_case_id(result: LoadedResult, prefix: str) -> str:
    return result.case_id.removeprefix(prefix) or result.case_id


def condition_labels(results: Sequence[LoadedResult]) -> dict[str, str]:
    """case_id -> 'dataset [differing settings]' so bars of one condition line up.

    Cases that would still collide (same condition and policy, e.g. Stage B's
    cold and steady-state phases) are told apart by their case id with the
    policy name taken out, which keeps the policies of one condition together.
    """
    values = {r.case_id: condition_values(r.doc) for r in results}
    prefix = case_id_prefix(results)
    varying = [name for name in CONDITION_FIELDS if len({v[name] for v in values.values()}) > 1]
    labels = {}
    for result in results:
        extra = " ".join(f"{name}={values[result.case_id][name]}" for name in varying)
        labels[result.case_id] = f"{result.dataset} {extra}".strip()
    seen: dict[tuple[str, str], int] = defaultdict(int)
    for result in results:
        seen[(labels[result.case_id], result.policy)] += 1
    for result in results:
        if seen[(labels[result.case_id], result.policy)] > 1:
            short = short_case_id(result, prefix)
            labels[result.case_id] = short.replace(result.policy, "").strip("/_-:") or short
    return labels


def per_layer_components(doc: Mapping[str, Any]) -> list[Mapping[str, float]] | None:
    timings = doc["evidence"]["per_layer_timings"]
    if is_absent(timings) or not isinstance(timings, Mapping) or LAYERS_KEY not in timings:
        return None
    return timings[LAYERS_KEY]


def layer_breakdown_from_tables(
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, Any]:
    """``{"layers": [...]}`` from per-role tables of (layer, ubatch, kind seconds) rows.

    The AFD runtime's instrumented step evidence holds such tables (``per_layer``:
    ``{"attention": rows, "ffn": rows}``); ubatches are summed and each
    component is named ``role/kind`` so both sides share one stacked bar.
    """
    totals: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for role, rows in tables.items():
        for row in rows:
            for kind, seconds in row.items():
                if kind not in TABLE_INDEX_KEYS:
                    totals[int(row["layer"])][f"{role}/{kind}"] += float(seconds)
    if not totals:
        return {LAYERS_KEY: []}
    return {LAYERS_KEY: [dict(sorted(totals[layer].items())) for layer in range(max(totals) + 1)]}


def normalised_expert_heat(doc: Mapping[str, Any]) -> np.ndarray | None:
    """Per layer, routed tokens per expert / the layer's mean (1.0 = balanced)."""
    load = doc["evidence"]["expert_load"]
    if is_absent(load) or not load["per_expert"]:
        return None
    matrix = np.asarray(load["per_expert"], dtype=np.float64)
    means = matrix.mean(axis=1, keepdims=True)
    return np.divide(matrix, means, out=np.zeros_like(matrix), where=means > 0)


# --- formatting -------------------------------------------------------------------
def short_digest(digest: str) -> str:
    return digest.removeprefix(DIGEST_PREFIX)[:DIGEST_SHORT_CHARS]


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.{digits}g}"


def _fmt_measure(value: Any) -> str:
    stats = _measured(value)
    if stats is None:
        return "—"
    cv = "—" if stats["cv"] is None else f"{stats['cv'] * PERCENT:.1f}%"
    return f"{stats['median']:.4g} (cv {cv}, n={stats['n']})"


def _fmt_ratio(value: float | None) -> str:
    return "—" if value is None else f"{value * PERCENT:.1f}%"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._") or "x"


def _labels_text(doc: Mapping[str, Any]) -> str:
    labels = doc["labels"]
    parts = []
    if labels["synthetic"]:
        parts.append("synthetic")
    if labels["comparability"] == "exploratory":
        reason = labels.get("comparability_reason")
        parts.append(f"exploratory ({reason})" if reason else "exploratory")
    return ", ".join(parts) or "—"


def stack_description(doc: Mapping[str, Any]) -> str:
    manifest = doc["manifest"]
    model = manifest["model"]
    layers = model["num_layers"]
    layer_text = "? layers" if is_absent(layers) else f"{layers} layers"
    emulated = " (CPU emulation)" if manifest["hardware"]["emulated"] else ""
    return (
        f"backend {manifest['backend']['name']}, model {model['name']} ({layer_text}), "
        f"topology {manifest['topology']['canonical']}{emulated}"
    )


# --- plots ------------------------------------------------------------------------
def _new_figure(panels: int) -> tuple[Figure, list[Any]]:
    columns = min(panels, 3)
    rows = math.ceil(panels / columns)
    figure = Figure(
        figsize=(PANEL_WIDTH_IN * columns, PANEL_HEIGHT_IN * rows),
        dpi=FIGURE_DPI,
        layout="constrained",
    )
    axes = [figure.add_subplot(rows, columns, index + 1) for index in range(panels)]
    return figure, axes


def _save(figure: Figure, path: Path) -> Path:
    FigureCanvasAgg(figure)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def _legend(axis: Any, fontsize: str = "small") -> None:
    """A legend only where something is labelled (matplotlib warns otherwise)."""
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=fontsize)


def _policies(results: Iterable[LoadedResult]) -> list[str]:
    return sorted({r.policy for r in results})


def plot_policy_metrics(results: Sequence[LoadedResult], path: Path) -> Path | None:
    """Prefill throughput and TTFT p50 per condition, one bar per policy, min-max bars."""
    labels = condition_labels(results)
    panels = [
        ("prefill throughput (tokens/s)", lambda doc: doc["metrics"]["prefill_tokens_per_s"]),
        ("TTFT p50 (s)", lambda doc: ttft_of(doc, "p50")),
        ("TTFT p99 (s)", lambda doc: ttft_of(doc, "p99")),
    ]
    if not any(median_of(read(r.doc)) is not None for r in results for _, read in panels):
        return None
    conditions = sorted(set(labels.values()))
    policies = _policies(results)
    figure, axes = _new_figure(len(panels))
    width = BAR_GROUP_WIDTH / len(policies)
    for axis, (title, read) in zip(axes, panels, strict=True):
        for offset, policy in enumerate(policies):
            heights, errors, positions = [], [[], []], []
            for index, condition in enumerate(conditions):
                matches = [
                    r for r in results if r.policy == policy and labels[r.case_id] == condition
                ]
                medians = [median_of(read(r.doc)) for r in matches]
                spreads = [spread_of(read(r.doc)) for r in matches]
                for value, spread in zip(medians, spreads, strict=True):
                    if value is None or spread is None:
                        continue
                    positions.append(index + (offset - (len(policies) - 1) / 2) * width)
                    heights.append(value)
                    errors[0].append(spread[0])
                    errors[1].append(spread[1])
            if heights:
                axis.bar(
                    positions,
                    heights,
                    width=width,
                    yerr=errors,
                    capsize=ERROR_CAPSIZE,
                    label=policy,
                )
        axis.set_title(title)
        axis.set_xticks(range(len(conditions)))
        axis.set_xticklabels(conditions, rotation=30, ha="right", fontsize="small")
    for axis in axes:
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize="small")
            break
    return _save(figure, path)


def step_time_spread(doc: Mapping[str, Any]) -> tuple[float, float]:
    """Min-max bar of the recorded step time; (0, 0) when only a point value exists."""
    metrics = doc["metrics"]
    spread = spread_of(metrics[STEP_TIME_METRIC]) if STEP_TIME_METRIC in metrics else None
    return spread or (0.0, 0.0)


def plot_imbalance_vs_step_time(results: Sequence[LoadedResult], path: Path) -> Path | None:
    """One point per split case (unsplit cases have no imbalance), labelled by condition."""
    labels = condition_labels(results)
    points = [(r, mean_imbalance(r.doc), step_time_s(r.doc)) for r in results]
    points = [(r, x, y) for r, x, y in points if x is not None and y is not None]
    if not points:
        return None
    figure, (axis,) = _new_figure(1)
    for policy in sorted({r.policy for r, _, _ in points}):
        mine = [(r, x, y) for r, x, y in points if r.policy == policy]
        spreads = [step_time_spread(r.doc) for r, _, _ in mine]
        axis.errorbar(
            [x * PERCENT for _, x, _ in mine],
            [y for _, _, y in mine],
            yerr=[[low for low, _ in spreads], [high for _, high in spreads]],
            fmt="o",
            capsize=ERROR_CAPSIZE,
            label=policy,
        )
        for result, x, y in mine:
            note = axis.annotate(
                labels[result.case_id],
                (x * PERCENT, y),
                fontsize="xx-small",
                xytext=(3, 3),
                textcoords="offset points",
            )
            # Point labels may run past the axes; the layout must not shrink the
            # axes to fit them (it collapses them to nothing with many cases).
            note.set_in_layout(False)
    axis.set_xlabel("realized ubatch token imbalance, mean over steps (%)")
    axis.set_ylabel("forward step time (s)")
    axis.set_title("imbalance vs step time (bars: min-max)")
    _legend(axis)
    return _save(figure, path)


def plot_layer_breakdown(results: Sequence[LoadedResult], path: Path) -> Path | None:
    cases = [(r, per_layer_components(r.doc)) for r in results]
    cases = [(r, layers) for r, layers in cases if layers]
    if not cases:
        return None
    shown = cases[:MAX_PANELS]
    prefix = case_id_prefix(results)
    figure, axes = _new_figure(len(shown))
    for axis, (result, layers) in zip(axes, shown, strict=True):
        components = sorted({name for layer in layers for name in layer})
        bottom = np.zeros(len(layers))
        for component in components:
            values = np.array([float(layer.get(component, 0.0)) for layer in layers])
            axis.bar(range(len(layers)), values, bottom=bottom, label=component)
            bottom += values
        axis.set_title(_wrap_title(short_case_id(result, prefix)), fontsize="small")
        axis.set_xlabel("layer")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylabel("time (s)")
        _legend(axis, "x-small")
    return _save(figure, path)


def _wrap_title(text: str, width: int = TITLE_WRAP_CHARS) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


def plot_expert_heat(results: Sequence[LoadedResult], path: Path) -> Path | None:
    """Mean normalised expert heat per (routing, layers x experts) group."""
    groups: dict[tuple[str, tuple[int, int]], list[np.ndarray]] = defaultdict(list)
    for result in results:
        heat = normalised_expert_heat(result.doc)
        if heat is not None:
            routing = result.doc["evidence"]["expert_load"]["routing"]
            groups[(routing, heat.shape)].append(heat)
    if not groups:
        return None
    shown = sorted(groups.items())[:MAX_PANELS]
    figure, axes = _new_figure(len(shown))
    for axis, ((routing, shape), heats) in zip(axes, shown, strict=True):
        image = axis.imshow(
            np.mean(heats, axis=0), aspect="auto", cmap="viridis", interpolation="nearest"
        )
        synthetic = " (synthetic)" if routing == "forced_balanced" else ""
        axis.set_title(f"{routing}{synthetic}: {len(heats)} case(s)", fontsize="small")
        axis.set_xlabel(f"expert (of {shape[1]})")
        axis.set_ylabel("MoE layer")
        figure.colorbar(image, ax=axis, label="tokens / layer mean")
    return _save(figure, path)


def plot_hit_ratio(results: Sequence[LoadedResult], path: Path) -> Path | None:
    """Realized vs requested hit ratio, and throughput vs realized ratio, per policy."""
    points = []
    for result in results:
        requested, realized = hit_ratios(result.doc)
        if requested is not None and realized is not None:
            points.append((result, requested, realized))
    if len({requested for _, requested, _ in points}) < 2:  # noqa: PLR2004 - a sweep
        return None
    figure, (ratio_axis, throughput_axis) = _new_figure(2)
    ratio_axis.plot([0, PERCENT], [0, PERCENT], color="grey", linestyle="--", label="requested")
    for policy in sorted({r.policy for r, _, _ in points}):
        mine = [(r, req, real) for r, req, real in points if r.policy == policy]
        ratio_axis.scatter(
            [req * PERCENT for _, req, _ in mine],
            [real * PERCENT for _, _, real in mine],
            label=policy,
        )
        measured = [
            (
                real,
                median_of(r.doc["metrics"]["prefill_tokens_per_s"]),
                spread_of(r.doc["metrics"]["prefill_tokens_per_s"]),
            )
            for r, _, real in mine
        ]
        measured = [(x, y, e) for x, y, e in measured if y is not None and e is not None]
        if measured:
            throughput_axis.errorbar(
                [x * PERCENT for x, _, _ in measured],
                [y for _, y, _ in measured],
                yerr=[[e[0] for _, _, e in measured], [e[1] for _, _, e in measured]],
                fmt="o",
                capsize=ERROR_CAPSIZE,
                label=policy,
            )
    ratio_axis.set_xlabel("requested hit ratio (%)")
    ratio_axis.set_ylabel("realized hit ratio (%)")
    ratio_axis.set_title("prefix-cache hits: realized vs requested")
    throughput_axis.set_xlabel("realized hit ratio (%)")
    throughput_axis.set_ylabel("prefill throughput (tokens/s)")
    throughput_axis.set_title("throughput vs realized hits (min-max)")
    _legend(ratio_axis)
    _legend(throughput_axis)
    return _save(figure, path)


def per_layer_rank_skew(doc: Mapping[str, Any]) -> list[float] | None:
    """Per MoE layer: max / mean routed tokens over EP ranks (1.0 = balanced)."""
    load = doc["evidence"]["expert_load"]
    if is_absent(load) or not load["per_rank"]:
        return None
    return [max(ranks) / float(np.mean(ranks)) if sum(ranks) else 1.0 for ranks in load["per_rank"]]


def plot_rank_skew(results: Sequence[LoadedResult], path: Path) -> Path | None:
    """Mean per-layer EP-rank skew per routing mode, min-max over cases."""
    groups: dict[tuple[str, int], list[list[float]]] = defaultdict(list)
    for result in results:
        skew = per_layer_rank_skew(result.doc)
        if skew is not None:
            routing = result.doc["evidence"]["expert_load"]["routing"]
            groups[(routing, len(skew))].append(skew)
    if not groups:
        return None
    figure, (axis,) = _new_figure(1)
    for (routing, layers), skews in sorted(groups.items()):
        matrix = np.asarray(skews)
        mean = matrix.mean(axis=0)
        synthetic = " (synthetic)" if routing == "forced_balanced" else ""
        axis.errorbar(
            range(layers),
            mean,
            yerr=[mean - matrix.min(axis=0), matrix.max(axis=0) - mean],
            marker="o",
            capsize=ERROR_CAPSIZE,
            label=f"{routing}{synthetic}, {len(skews)} case(s)",
        )
    axis.axhline(1.0, color="grey", linestyle="--")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("MoE layer")
    axis.set_ylabel("EP-rank load max / mean")
    axis.set_title("rank skew per layer (bars: min-max over cases)")
    _legend(axis, "x-small")
    return _save(figure, path)


def _chunk_sort_key(label: str) -> tuple[int, int]:
    return (1, 0) if label == UNCHUNKED_LABEL else (0, int(label))


def plot_chunk_sweep(results: Sequence[LoadedResult], path: Path) -> Path | None:
    """Throughput per chunk size, one line per (dataset, policy); invalid sizes marked x."""
    labels = sorted({chunk_label(r.doc) for r in results}, key=_chunk_sort_key)
    if len(labels) < 2:  # noqa: PLR2004 - a sweep needs two sizes
        return None
    figure, (axis,) = _new_figure(1)
    series: dict[str, list[LoadedResult]] = defaultdict(list)
    for result in results:
        series[f"{result.dataset} / {result.policy}"].append(result)
    invalid_drawn = False
    for name, members in sorted(series.items()):
        xs, ys, low, high = [], [], [], []
        for result in sorted(members, key=lambda r: _chunk_sort_key(chunk_label(r.doc))):
            valid, _ = chunk_validity(result.doc)
            x = labels.index(chunk_label(result.doc))
            measure = result.doc["metrics"]["prefill_tokens_per_s"]
            if not valid:
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
            value, spread = median_of(measure), spread_of(measure)
            if value is None or spread is None:
                continue
            xs.append(x)
            ys.append(value)
            low.append(spread[0])
            high.append(spread[1])
        if xs:
            axis.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=ERROR_CAPSIZE, label=name)
    axis.set_xticks(range(len(labels)))
    axis.set_xticklabels(labels)
    axis.set_xlabel("chunk size (tokens)")
    axis.set_ylabel("prefill throughput (tokens/s)")
    axis.set_title("chunk-size sweep")
    _legend(axis, "x-small")
    return _save(figure, path)


PLOTTERS = (
    (
        "policy_metrics",
        "TTFT and throughput per policy (bars: min-max over repetitions)",
        plot_policy_metrics,
    ),
    (
        "imbalance_vs_step_time",
        "Realized imbalance vs forward step time",
        plot_imbalance_vs_step_time,
    ),
    ("layer_breakdown", "Per-layer time breakdown (instrumented runs)", plot_layer_breakdown),
    ("expert_heat", "Expert heat per layer (tokens / layer mean)", plot_expert_heat),
    ("rank_skew", "EP-rank skew per layer (max / mean routed tokens)", plot_rank_skew),
    ("chunk_sweep", "Chunk-size sweep (invalid sizes marked x)", plot_chunk_sweep),
    ("hit_ratio", "Prefix-cache hit ratio: realized vs requested, and throughput", plot_hit_ratio),
)


# --- markdown -----------------------------------------------------------------------
TABLE_HEADER = (
    "case",
    "workload",
    "policy",
    "condition",
    "prefill tokens/s",
    "TTFT p50 (s)",
    "TTFT p90 / p95 / p99 (s)",
    "requests/s",
    "completed/failed",
    "peak memory (MiB)",
    "tokens logical / scheduled / padded",
    "mean / max imbalance",
    "hit requested / realized",
    "rank skew",
    "labels",
)
BYTES_PER_MIB = 1024 * 1024


def _tokens_text(doc: Mapping[str, Any]) -> str:
    tokens = doc["evidence"]["tokens"]
    if is_absent(tokens):
        return "—"
    return (
        f"{tokens['logical_prompt_tokens']} / {tokens['scheduled_real_tokens']} / "
        f"{tokens['padded_tokens']}"
    )


def _count_text(value: Any) -> str:
    return "—" if is_absent(value) else str(value)


def _row(result: LoadedResult, condition: str, prefix: str) -> list[str]:
    doc = result.doc
    metrics = doc["metrics"]
    imbalances = step_imbalances(doc)
    requested, realized = hit_ratios(doc)
    valid, reason = chunk_validity(doc)
    labels = _labels_text(doc) if valid else f"invalid chunk size: {reason}"
    throughput = metrics["prefill_tokens_per_s"]
    if valid and is_absent(throughput):
        labels = (
            f"{labels}; {throughput['absent_reason']}"
            if labels != "—"
            else throughput["absent_reason"]
        )
    memory = median_of(metrics["peak_memory_bytes"])
    tails = " / ".join(_fmt(median_of(ttft_of(doc, key)), 4) for key in TTFT_PERCENTILE_KEYS[1:])
    return [
        short_case_id(result, prefix),
        result.dataset,
        result.policy,
        condition,
        _fmt_measure(metrics["prefill_tokens_per_s"]),
        _fmt_measure(ttft_of(doc, "p50")),
        tails,
        _fmt_measure(metrics["request_throughput"]),
        f"{_count_text(metrics['completed_requests'])}/{_count_text(metrics['failed_requests'])}",
        _fmt(None if memory is None else memory / BYTES_PER_MIB, 4),
        _tokens_text(doc),
        f"{_fmt_ratio(float(np.mean(imbalances)) if imbalances else None)} / "
        f"{_fmt_ratio(max(imbalances) if imbalances else None)}",
        f"{_fmt_ratio(requested)} / {_fmt_ratio(realized)}",
        _fmt(rank_skew(doc)),
        labels,
    ]


# The RFC's control and its proposal: their ratio is the headline comparison.
CONTROL_POLICY = "request_boundary"
PROPOSED_POLICY = "token_balanced"


def _comparison_table(results: Sequence[LoadedResult]) -> list[str]:
    """Median prefill tokens/s per condition x policy, plus proposed / control."""
    policies = _policies(results)
    if len(policies) < 2:  # noqa: PLR2004 - a comparison needs two policies
        return []
    labels = condition_labels(results)
    cells: dict[tuple[str, str], float | None] = {}
    for result in results:
        cells[(labels[result.case_id], result.policy)] = median_of(
            result.doc["metrics"]["prefill_tokens_per_s"]
        )
    with_ratio = CONTROL_POLICY in policies and PROPOSED_POLICY in policies
    header = ["condition", *policies]
    if with_ratio:
        header.append(f"{PROPOSED_POLICY} / {CONTROL_POLICY}")
    lines = [
        "Median prefill tokens/s per policy:",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for condition in sorted(set(labels.values())):
        row = [condition, *(_fmt(cells.get((condition, p)), 4) for p in policies)]
        if with_ratio:
            proposed = cells.get((condition, PROPOSED_POLICY))
            control = cells.get((condition, CONTROL_POLICY))
            row.append(_fmt(proposed / control if proposed and control else None, 3))
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return [*lines, ""]


WORKLOAD_HEADER = (
    "workload",
    "digest",
    "requests",
    "total",
    "mean",
    "p50",
    "p90",
    "p99",
    "CV",
    "min",
    "max",
    "arrival",
)


def _workload_table(results: Sequence[LoadedResult]) -> list[str]:
    """Prompt-length statistics of every dataset the stack ran (Stage C asks for them)."""
    lines = ["| " + " | ".join(WORKLOAD_HEADER) + " |", "|" + "---|" * len(WORKLOAD_HEADER)]
    seen: dict[tuple[str, str], Mapping[str, Any]] = {}
    for result in results:
        workload = result.doc["workload"]
        digest = workload["dataset"]["digest"]
        digest_text = "—" if is_absent(digest) else str(digest)[:DIGEST_SHORT_CHARS]
        seen.setdefault((result.dataset, digest_text), workload)
    for (name, digest_text), workload in sorted(seen.items()):
        lengths = workload["prompt_lengths"]
        total = sum(lengths["values"]) if "values" in lengths else None
        cells = [
            name,
            f"`{digest_text}`",
            str(workload["request_count"]),
            _fmt(total, 8),
            *(_fmt(lengths[key], 5) for key in ("mean", "p50", "p90", "p99", "cv", "min", "max")),
            workload["arrival_process"],
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _table(results: Sequence[LoadedResult]) -> list[str]:
    labels = condition_labels(results)
    prefix = case_id_prefix(results)
    lines = [f"Case ids below follow `{prefix}`.", ""] if prefix else []
    lines += ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "---|" * len(TABLE_HEADER)]
    for result in sorted(results, key=lambda r: (labels[r.case_id], r.policy, r.case_id)):
        condition = labels[result.case_id].removeprefix(result.dataset).strip() or "—"
        cells = _row(result, condition, prefix)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _stage_title(stage: str) -> str:
    return MARKERS.get(stage, stage)


def _section(stage: str, stacks: Mapping[str, list[LoadedResult]], report_dir: Path) -> list[str]:
    lines = [f"## {stage}: {_stage_title(stage)}", ""]
    if len(stacks) > 1:
        lines += [
            f"These results come from {len(stacks)} different stacks (manifest digests); "
            "they are reported separately and never compared across stacks.",
            "",
        ]
    for digest, results in sorted(stacks.items()):
        lines += [
            f"### Stack `{short_digest(digest)}`",
            "",
            f"{stack_description(results[0].doc)}; {len(results)} case(s).",
            "",
            *_table(results),
            "",
            *_comparison_table(results),
            "Workloads:",
            "",
            *_workload_table(results),
            "",
        ]
        for name, caption, plotter in PLOTTERS:
            file_name = f"{_slug(stage)}-{short_digest(digest)}-{name}.png"
            written = plotter(results, report_dir / PLOTS_DIR_NAME / file_name)
            if written is not None:
                relative = written.relative_to(report_dir).as_posix()
                lines += [f"![{caption}]({relative})", "", f"*{caption}.*", ""]
    return lines


def _stacks_overview(results: Sequence[LoadedResult]) -> list[str]:
    by_digest: dict[str, LoadedResult] = {}
    counts: dict[str, int] = defaultdict(int)
    for result in results:
        by_digest.setdefault(result.digest, result)
        counts[result.digest] += 1
    lines = ["## Stacks", "", "| stack | description | cases |", "|---|---|---|"]
    for digest, result in sorted(by_digest.items()):
        lines.append(
            f"| `{short_digest(digest)}` | {_cell(stack_description(result.doc))} | {counts[digest]} |"
        )
    if len(by_digest) > 1:
        lines += [
            "",
            f"{len(by_digest)} stacks are present. Only cases with the same manifest digest "
            "are compared; each stage section keeps stacks apart.",
        ]
    return [*lines, ""]


def render_markdown(loaded: LoadedResults, results_dir: Path, report_dir: Path) -> str:
    lines = [
        "# pytest-afd report",
        "",
        f"Results directory: `{results_dir}`; {len(loaded.results)} result(s), "
        f"{len(loaded.skipped)} file(s) skipped.",
        "",
    ]
    if loaded.ignored:
        names = ", ".join(f"`{path.relative_to(results_dir)}`" for path in loaded.ignored)
        lines += [f"Other JSON files (not results, not read): {names}.", ""]
    lines += [
        "Headline numbers are medians over measured repetitions (after warmup) of "
        "non-instrumented runs; cv is the coefficient of variation. Imbalance is "
        "|t0 - t1| / T of the realized ubatches.",
        "",
    ]
    if not loaded.results:
        lines += ["No result documents were found.", ""]
    else:
        lines += _stacks_overview(loaded.results)
    by_stage: dict[str, dict[str, list[LoadedResult]]] = defaultdict(lambda: defaultdict(list))
    for result in loaded.results:
        by_stage[result.stage][result.digest].append(result)
    for stage in (*STAGE_KINDS, *OTHER_KINDS):
        if stage in by_stage:
            lines += _section(stage, by_stage[stage], report_dir)
    if loaded.skipped:
        lines += ["## Skipped files", "", "| file | reason |", "|---|---|"]
        for path, reason in loaded.skipped:
            lines.append(f"| `{path.relative_to(results_dir)}` | {_cell(reason)} |")
        lines.append("")
    return "\n".join(lines)


def render(results_dir: str | Path, output_dir: str | Path | None = None) -> Path:
    """Write ``<results_dir>/report/report.md`` (+ ``plots/*.png``); returns its path."""
    source = Path(results_dir)
    if not source.is_dir():
        raise FileNotFoundError(f"results directory {str(source)!r} does not exist")
    report_dir = Path(output_dir) if output_dir is not None else source / REPORT_DIR_NAME
    plots_dir = report_dir / PLOTS_DIR_NAME
    plots_dir.mkdir(parents=True, exist_ok=True)
    for stale in plots_dir.glob("*.png"):
        stale.unlink()
    loaded = load_results(source, exclude=report_dir)
    text = render_markdown(loaded, source, report_dir)
    target = report_dir / REPORT_FILE_NAME
    target.write_text(text + "\n")
    return target
