"""Reading values out of result documents: measurements, evidence, conditions, stacks.

Fields read beyond the schema's required ones (all optional; docs/report.md):

- ``metrics.step_time_s`` (a measurement) or, per step, ``wall_time_s``:
  forward step time; without either it is run wall time / forward steps.
- ``evidence.per_layer_timings.layers``: one ``{component: seconds}`` per layer.
- ``evidence.chunk_plan``: ``SchedulePlan.to_json()``; ``valid: false`` marks
  the chunk size invalid.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pytest_afd.report.loading import LoadedResult
from pytest_afd.results.documents import is_absent

PERCENT = 100.0
UNCHUNKED_LABEL = "unchunked"
STEP_TIME_METRIC = "step_time_s"
STEP_WALL_TIME = "wall_time_s"
CHUNK_PLAN_KEY = "chunk_plan"
LAYERS_KEY = "layers"
TABLE_INDEX_KEYS = frozenset({"layer", "ubatch"})
TTFT_PERCENTILE_KEYS = ("p50", "p90", "p95", "p99")
NO_PHASE = "-"
FORCED_ROUTING = "forced_balanced"
# Older results spelled the arrival process with hyphens; one spelling everywhere now.
LEGACY_ARRIVAL_SPELLINGS = {"all-at-once": "all_at_once"}
# Settings that tell two cases of one stage apart besides the split policy, with
# their short label form ("{}" takes the value).
CONDITION_FORMATS = {
    "routing": "{}",
    "chunk": "chunk {}",
    "prefix_cache": "cache {}",
    "phase": "{}",
    "hit": "hit {}",
    "quant": "{}",
    "align": "align {}",
    "tokens": "{} tok",
    "requests": "{} req",
}
CONDITION_FIELDS = tuple(CONDITION_FORMATS)
# Pytest node id pieces: "path::function[params]/case/suffix".
NODE_SEPARATOR = "::"
PARAM_PATTERN = re.compile(r"\[([^\]]*)\]")


# --- measurements ------------------------------------------------------------------
def measured_stats(value: Any) -> Mapping[str, Any] | None:
    """The stats of a schema ``measurement``; None when absent."""
    if value is None or is_absent(value):
        return None
    return value["stats"]


def median_of(value: Any) -> float | None:
    stats = measured_stats(value)
    return None if stats is None else float(stats["median"])


def spread_of(value: Any) -> tuple[float, float] | None:
    """(median - min, max - median): the dispersion bar of one measurement."""
    stats = measured_stats(value)
    if stats is None:
        return None
    return float(stats["median"] - stats["min"]), float(stats["max"] - stats["median"])


def repetitions_of(value: Any) -> list[float]:
    if value is None or is_absent(value):
        return []
    return [float(v) for v in value.get("repetitions", [])]


def throughput(doc: Mapping[str, Any]) -> Any:
    return doc["metrics"]["prefill_tokens_per_s"]


def ttft_of(doc: Mapping[str, Any], percentile: str) -> Any:
    ttft = doc["metrics"]["ttft_s"]
    return None if is_absent(ttft) else ttft[percentile]


# --- evidence ------------------------------------------------------------------------
def step_imbalances(doc: Mapping[str, Any]) -> list[float]:
    steps = doc["evidence"]["steps"]
    if is_absent(steps):
        return []
    return [float(step["imbalance"]) for step in steps if step["imbalance"] is not None]


def mean_imbalance(doc: Mapping[str, Any]) -> float | None:
    values = step_imbalances(doc)
    return float(np.mean(values)) if values else None


def step_time_s(doc: Mapping[str, Any]) -> float | None:
    """Forward step time: ``metrics.step_time_s``, else mean step wall time, else derived."""
    metrics = doc["metrics"]
    if STEP_TIME_METRIC in metrics:
        return median_of(metrics[STEP_TIME_METRIC])
    steps = doc["evidence"]["steps"]
    if is_absent(steps) or not steps:
        return None
    if all(STEP_WALL_TIME in step for step in steps):
        return float(np.mean([step[STEP_WALL_TIME] for step in steps]))
    tokens = doc["evidence"]["tokens"]
    rate = median_of(metrics["prefill_tokens_per_s"])
    if is_absent(tokens) or not rate:
        return None
    return tokens["logical_prompt_tokens"] / rate / len(steps)


def step_time_spread(doc: Mapping[str, Any]) -> tuple[float, float]:
    """Min-max bar of the recorded step time; (0, 0) when only a point value exists."""
    metrics = doc["metrics"]
    spread = spread_of(metrics[STEP_TIME_METRIC]) if STEP_TIME_METRIC in metrics else None
    return spread or (0.0, 0.0)


def per_layer_rank_skew(doc: Mapping[str, Any]) -> list[float] | None:
    """Per MoE layer: max / mean routed tokens over EP ranks (1.0 = balanced)."""
    load = doc["evidence"]["expert_load"]
    if is_absent(load) or not load["per_rank"]:
        return None
    return [max(ranks) / float(np.mean(ranks)) if sum(ranks) else 1.0 for ranks in load["per_rank"]]


def rank_skew(doc: Mapping[str, Any]) -> float | None:
    """Worst layer's max/mean routed tokens over EP ranks (1.0 = balanced)."""
    skews = per_layer_rank_skew(doc)
    return max(skews) if skews else None


def normalised_expert_heat(doc: Mapping[str, Any]) -> np.ndarray | None:
    """Per layer, routed tokens per expert / the layer's mean (1.0 = balanced)."""
    load = doc["evidence"]["expert_load"]
    if is_absent(load) or not load["per_expert"]:
        return None
    matrix = np.asarray(load["per_expert"], dtype=np.float64)
    means = matrix.mean(axis=1, keepdims=True)
    return np.divide(matrix, means, out=np.zeros_like(matrix), where=means > 0)


def expert_routing(doc: Mapping[str, Any]) -> str:
    return doc["evidence"]["expert_load"]["routing"]


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


def chunk_sort_key(label: str) -> tuple[int, int]:
    return (1, 0) if label == UNCHUNKED_LABEL else (0, int(label))


def chunk_validity(doc: Mapping[str, Any]) -> tuple[bool, str]:
    """(valid, reason) from ``evidence.chunk_plan`` when the case recorded one."""
    evidence = doc["evidence"]
    if CHUNK_PLAN_KEY not in evidence or is_absent(evidence[CHUNK_PLAN_KEY]):
        return True, ""
    plan = evidence[CHUNK_PLAN_KEY]
    return bool(plan["valid"]), "; ".join(plan["reasons"])


def per_layer_components(doc: Mapping[str, Any]) -> list[Mapping[str, float]] | None:
    timings = doc["evidence"]["per_layer_timings"]
    if is_absent(timings) or not isinstance(timings, Mapping) or LAYERS_KEY not in timings:
        return None
    return timings[LAYERS_KEY]


def layer_breakdown_from_tables(
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
) -> dict[str, Any]:
    """``{"layers": [...]}`` from per-role tables of (layer, ubatch, kind seconds) rows.

    Ubatches are summed and each component is named ``role/kind`` so both
    sides of the AFD runtime share one stacked bar.
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


def arrival_process(doc: Mapping[str, Any]) -> str:
    value = doc["workload"]["arrival_process"]
    return LEGACY_ARRIVAL_SPELLINGS.get(value, value)


# --- conditions: short labels, never a test id ---------------------------------------------
def align_label(split_align: Any) -> str:
    """An explicit alignment, or "topology" when the run took the topology's layout."""
    return "topology" if is_absent(split_align) else str(split_align)


def condition_values(doc: Mapping[str, Any]) -> dict[str, str]:
    """The settings besides the split policy that define a case's condition."""
    settings = doc["settings"]
    requested, _ = hit_ratios(doc)
    lengths = doc["workload"]["prompt_lengths"]
    total = sum(lengths["values"]) if "values" in lengths else None
    return {
        "routing": settings["expert_balancing"]["routing"],
        "chunk": chunk_label(doc),
        "prefix_cache": "on" if settings["prefix_cache"]["enabled"] else "off",
        "phase": settings["prefix_cache"].get("phase", NO_PHASE),
        "hit": "-" if requested is None else f"{requested * PERCENT:.0f}%",
        "quant": settings["quantization"],
        "align": align_label(settings["split_constraints"]["split_align"]),
        "tokens": "-" if total is None else str(total),
        "requests": str(doc["workload"]["request_count"]),
    }


def _node_tokens(case_id: str) -> list[str]:
    """Parametrisation ids and case-suffix segments of a case id (not the test's name)."""
    _, _, tail = case_id.rpartition(NODE_SEPARATOR)
    tokens: list[str] = []
    for params in PARAM_PATTERN.findall(tail):
        tokens += [token for token in params.split("-") if token]
    suffix = PARAM_PATTERN.sub("", tail).split("/")[1:]  # segment 0 is the function name
    return tokens + [segment for segment in suffix if segment]


def _distinguishing_tokens(members: Sequence[LoadedResult], label: str) -> dict[str, str]:
    """For cases sharing one label: the id tokens that tell them apart (policy excluded)."""
    tokens = {r.case_id: _node_tokens(r.case_id) for r in members}
    common = set.intersection(*(set(t) for t in tokens.values()))
    extra = {}
    for result in members:
        shown = [
            token
            for token in tokens[result.case_id]
            if token not in common and token != result.policy and token not in label
        ]
        extra[result.case_id] = " ".join(dict.fromkeys(shown))
    return extra


def condition_labels(results: Sequence[LoadedResult]) -> dict[str, str]:
    """case_id -> short 'dataset differing-settings' label, so one condition's policies line up.

    Only settings that vary within ``results`` are named. Cases that still share
    a label and a policy (two test parametrisations, a sweep and its
    confirmation) get the parametrisation or case-suffix tokens that tell them
    apart; the label never shows the test's node id.
    """
    values = {r.case_id: condition_values(r.doc) for r in results}
    varying = [name for name in CONDITION_FIELDS if len({v[name] for v in values.values()}) > 1]
    labels = {}
    for result in results:
        mine = values[result.case_id]
        parts = [
            CONDITION_FORMATS[name].format(mine[name]) for name in varying if mine[name] != "-"
        ]
        labels[result.case_id] = " ".join([result.dataset, *parts])
    groups: dict[tuple[str, str], list[LoadedResult]] = defaultdict(list)
    for result in results:
        groups[(labels[result.case_id], result.policy)].append(result)
    for (label, _), members in groups.items():
        if len(members) < 2:  # noqa: PLR2004 - a single case keeps its label
            continue
        extra = _distinguishing_tokens(members, label)
        for index, result in enumerate(members, start=1):
            tag = extra[result.case_id] or f"#{index}"
            labels[result.case_id] = f"{label} {tag}"
    return labels


def natural_key(text: str) -> list[Any]:
    """Sort key that orders "chunk 128" before "chunk 1024"."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


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


# --- stacks: what ran ------------------------------------------------------------------
def _known(value: Any) -> Any:
    return None if value is None or is_absent(value) else value


def stack_fields(doc: Mapping[str, Any]) -> dict[str, str]:
    """What ran, from the manifest's run identity (``manifest.run``) where present.

    backend and mode (with rank counts), model, layers, topology, quantization,
    threads, and whether the hardware was emulated.
    """
    manifest = doc["manifest"]
    run = manifest.get("run", {})
    model = manifest["model"]
    layers = _known(run.get("num_layers", model.get("num_layers")))
    mode = _known(run.get("backend_mode"))
    if mode == "afd_processes":
        attention, ffn = _known(run.get("attention_ranks")), _known(run.get("ffn_ranks"))
        mode = f"{mode} ({attention} attention + {ffn} FFN)"
    threads = _known(run.get("threads"))
    # Routing, quantization and block size are per-case run keys (manifest.CASE_RUN_KEYS):
    # cases of one stack differ in them, so the stack names only the model's own quantization.
    fields = {
        "backend": _known(run.get("backend")) or manifest["backend"]["name"],
        "mode": mode,
        "model": _known(run.get("model")) or model["name"],
        "layers": None if layers is None else f"{layers} layers",
        "topology": _known(run.get("topology")) or manifest["topology"]["canonical"],
        "quantization": _known(model.get("quantization")),
        "threads": None if threads is None else f"{threads} threads",
        "emulated": "CPU emulation" if manifest["hardware"]["emulated"] else None,
    }
    return {name: str(value) for name, value in fields.items() if value not in (None, "none")}


def stack_description(doc: Mapping[str, Any]) -> str:
    fields = stack_fields(doc)
    model = f"model {fields['model']}" + (f" ({fields['layers']})" if "layers" in fields else "")
    parts = [f"backend {fields['backend']}"]
    if "mode" in fields:
        parts.append(f"mode {fields['mode']}")
    parts += [model, f"topology {fields['topology']}"]
    if "quantization" in fields:
        parts.append(f"quantization {fields['quantization']}")
    if "threads" in fields:
        parts.append(fields["threads"])
    text = ", ".join(parts)
    return f"{text} ({fields['emulated']})" if "emulated" in fields else text


def stack_short_label(doc: Mapping[str, Any]) -> str:
    """``reduced/10L dp3pcp8-ep8 afd_processes``: what a plot legend or heading needs."""
    fields = stack_fields(doc)
    layers = fields.get("layers", "").removesuffix(" layers")
    model = f"{fields['model']}/{layers}L" if layers else fields["model"]
    mode = fields.get("mode", "").split(" ")[0]
    extras = [fields.get("quantization", "")]
    if mode and mode != "in_process":
        extras.append(mode)
    return " ".join([model, fields["topology"], *(extra for extra in extras if extra)])
