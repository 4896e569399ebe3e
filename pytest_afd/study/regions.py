"""Operating regions: where token_balanced should be used, where not, with what effect and how sure.

A *tested point* is one condition (the case id without its policy segment)
measured with both request_boundary (control) and token_balanced
(proposed), uninstrumented and passed. Points are grouped into *series* by
everything but the workload (stage, stack, topology, layers, routing, chunk
size, batch tokens, requested prefix hit) and ordered along the condition
axis: the realized imbalance of the control's split (the mean
``evidence.steps[].imbalance`` of the request_boundary case: how uneven the
request-boundary cut left the two micro-batches, which token_balanced
removes). Each point gets a call (:mod:`pytest_afd.study.effects`); a
*region* is a maximal run of adjacent points with the same call, and the
boundary between two regions is stated as the interval between the last
point of one and the first point of the next (nothing between two tested
points is known). A point whose control recorded no imbalance is a region of
its own, placed by its workload only.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_afd.core.absent import absent
from pytest_afd.report.values import (
    hit_ratios,
    mean_imbalance,
    repetitions_of,
    stack_short_label,
    ttft_of,
)
from pytest_afd.results.manifest import stack_digest
from pytest_afd.study import effects
from pytest_afd.study.effects import RatioInterval
from pytest_afd.study.limitations import is_instrumented, production_gaps

CONTROL = effects.REQUEST_BOUNDARY
PROPOSED = effects.TOKEN_BALANCED
AXIS = "realized_imbalance"
PASSED = "passed"
DIAGNOSTIC = "diagnostic"
PRODUCTION = "production"
TTFT_PERCENTILE = "p50"
NO_IMBALANCE = "the request_boundary case recorded no split imbalance (evidence.steps absent)"
NO_HIT = "no case recorded a realized prefix-hit ratio"


@dataclass(frozen=True)
class Point:
    series: tuple[tuple[str, Any], ...]
    condition: str
    workload: str
    imbalance: float | None
    hits: tuple[float, ...]
    control: tuple[Mapping[str, Any], ...]
    proposed: tuple[Mapping[str, Any], ...]
    throughput: RatioInterval | None
    ttft: RatioInterval | None
    call: str
    reason: str

    @property
    def cases(self) -> list[str]:
        return sorted(doc["case_id"] for doc in (*self.control, *self.proposed))

    @property
    def gaps(self) -> list[str]:
        return sorted({gap for doc in (*self.control, *self.proposed) for gap in production_gaps(doc)})


def condition_of(doc: Mapping[str, Any]) -> str:
    """The case id without its policy segment: the condition both policies ran."""
    return doc["case_id"].removesuffix("/" + doc["settings"]["split_policy"])


def series_of(doc: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Everything a region's conditions hold fixed besides the workload."""
    settings, run = doc["settings"], doc["manifest"].get("run", {})
    requested, _ = hit_ratios(doc)
    chunk = settings["chunked_prefill"]
    return (
        ("stage", doc["case_kind"]),
        ("stack", stack_short_label(doc)),
        ("topology", run.get("topology", doc["manifest"]["topology"].get("canonical"))),
        ("layers", run.get("num_layers")),
        ("routing", settings["expert_balancing"]["routing"]),
        ("chunk_size", chunk["chunk_size"] if chunk["enabled"] else None),
        ("batch_tokens", settings["scheduler"]["max_num_batched_tokens"]),
        ("requested_hit", requested),
    )


def _pooled(docs: Sequence[Mapping[str, Any]], values) -> list[float]:
    return [v for doc in docs for v in values(doc)]


def _throughputs(doc: Mapping[str, Any]) -> list[float]:
    return repetitions_of(doc["metrics"]["prefill_tokens_per_s"])


def _ttfts(doc: Mapping[str, Any]) -> list[float]:
    return repetitions_of(ttft_of(doc, TTFT_PERCENTILE))


def _interval(control, proposed, values, family: int) -> tuple[RatioInterval | None, str]:
    a, b = _pooled(control, values), _pooled(proposed, values)
    try:
        return effects.ratio_interval(a, b, family), ""
    except ValueError as exc:
        return None, str(exc)


def make_point(series, condition: str, control: Sequence[Mapping[str, Any]],
               proposed: Sequence[Mapping[str, Any]], family: int = 1) -> Point:
    """``family``: how many points the series states together (their intervals are simultaneous)."""
    throughput, why = _interval(control, proposed, _throughputs, family)
    ttft, _ = _interval(control, proposed, _ttfts, family)
    if throughput is None:
        call, reason = effects.UNDECIDED, f"no interval: {why}"
    else:
        call = effects.throughput_call(throughput)
        reason = {effects.NO_DIFFERENCE: f"the interval lies within ±{effects.MIN_EFFECT:.0%}",
                  effects.UNDECIDED: "the interval does not decide (it spans 1 or the effect is "
                  f"under {effects.MIN_EFFECT:.0%})"}.get(call, "the interval excludes 1 and "
                                                       f"the effect exceeds {effects.MIN_EFFECT:.0%}")
        if effects.ttft_contradicts(call, ttft):
            call, reason = effects.UNDECIDED, f"throughput favours {call} but TTFT p50 moves against it"
    imbalances = [v for v in (mean_imbalance(doc) for doc in control) if v is not None]
    hits = tuple(h for doc in (*control, *proposed) if (h := hit_ratios(doc)[1]) is not None)
    return Point(series, condition, control[0]["workload"]["dataset"]["name"],
                 sum(imbalances) / len(imbalances) if imbalances else None, hits,
                 tuple(control), tuple(proposed), throughput, ttft, call, reason)


def tested_points(docs: Sequence[Mapping[str, Any]]) -> list[Point]:
    """Every condition with both policies, from passed uninstrumented results (all sessions pooled)."""
    sides: dict[tuple[str, str], dict[str, list[Mapping[str, Any]]]] = defaultdict(
        lambda: defaultdict(list))
    for doc in docs:
        policy = doc["settings"]["split_policy"]
        status = doc.get("outcome", {}).get("status", PASSED)
        if policy in (CONTROL, PROPOSED) and status == PASSED and not is_instrumented(doc):
            sides[(stack_digest(doc["manifest"]), condition_of(doc))][policy].append(doc)
    pairs = [(series_of(found[CONTROL][0]), condition, found)
             for (_, condition), found in sorted(sides.items()) if found[CONTROL] and found[PROPOSED]]
    family = Counter(series for series, _, _ in pairs)
    return [make_point(series, condition, found[CONTROL], found[PROPOSED], family[series])
            for series, condition, found in pairs]


def _range(values: Sequence[float], reason: str) -> Any:
    return {"low": min(values), "high": max(values)} if values else absent(reason)


def _effect(intervals: Sequence[RatioInterval | None], what: str) -> Any:
    known = [i for i in intervals if i is not None]
    if len(known) < len(intervals) or not known:
        return absent(f"a point of this region has no {what} interval")
    return effects.pooled_interval(known).to_json()


def workload_shape(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Requests and prompt-length mean / CV of the workload (what "workload shape" means here)."""
    lengths = doc["workload"]["prompt_lengths"]
    return {"requests": doc["workload"]["request_count"], "mean_prompt_tokens": lengths["mean"],
            "prompt_cv": lengths["cv"]}


def _point_json(point: Point) -> dict[str, Any]:
    return {
        "condition": point.condition,
        "workload": point.workload,
        "workload_shape": workload_shape(point.control[0]),
        AXIS: point.imbalance if point.imbalance is not None else absent(NO_IMBALANCE),
        "call": point.call,
        "reason": point.reason,
        "prefill_tokens_per_s": point.throughput.to_json() if point.throughput
        else absent(point.reason),
        "ttft_p50": point.ttft.to_json() if point.ttft else absent("TTFT repetitions missing"),
        "cases": point.cases,
    }


def _region_json(run: Sequence[Point], series: Mapping[str, Any], number: int) -> dict[str, Any]:
    call = run[0].call
    gaps = sorted({gap for point in run for gap in point.gaps})
    imbalances = [p.imbalance for p in run if p.imbalance is not None]
    return {
        "id": f"R{number}",
        "label": DIAGNOSTIC if gaps else PRODUCTION,
        "label_reason": "; ".join(gaps) if gaps else "full-layer natural-routing NPU evidence",
        "conditions": {
            AXIS: _range(imbalances, NO_IMBALANCE),
            "prefix_hit": _range([h for p in run for h in p.hits], NO_HIT),
            "workloads": [p.workload for p in run],
            "chunk_size": series["chunk_size"],
            "batch_tokens": series["batch_tokens"],
            "topology": series["topology"],
        },
        "call": call,
        "recommendation": effects.recommendation(call),
        "reason": "; ".join(sorted({p.reason for p in run})),
        "effect": {
            "prefill_tokens_per_s": _effect([p.throughput for p in run], "throughput"),
            "ttft_p50": _effect([p.ttft for p in run], "TTFT"),
        },
        "points": [_point_json(p) for p in run],
        "cases": sorted({case for p in run for case in p.cases}),
    }


def _runs_of(points: Sequence[Point]) -> list[list[Point]]:
    """Maximal runs of adjacent points with the same call (points without an axis value stand alone)."""
    runs: list[list[Point]] = []
    for point in points:
        alone = point.imbalance is None or (runs and runs[-1][-1].imbalance is None)
        if runs and not alone and runs[-1][-1].call == point.call:
            runs[-1].append(point)
        else:
            runs.append([point])
    return runs


def _axis_key(point: Point) -> tuple[float, str]:
    return (math.inf if point.imbalance is None else point.imbalance, point.condition)


def series_regions(points: Sequence[Point], first_number: int) -> dict[str, Any]:
    """One series' regions along the axis and the boundaries between them."""
    ordered = sorted(points, key=_axis_key)
    series = dict(ordered[0].series)
    runs = _runs_of(ordered)
    regions = [_region_json(run, series, first_number + i) for i, run in enumerate(runs)]
    boundaries = [
        {"axis": AXIS, "between": [left[-1].imbalance, right[0].imbalance],
         "from_region": regions[i]["id"], "to_region": regions[i + 1]["id"],
         "from_call": left[-1].call, "to_call": right[0].call}
        for i, (left, right) in enumerate(itertools.pairwise(runs))
        if left[-1].imbalance is not None and right[0].imbalance is not None
    ]
    return {"conditions": series, "axis": AXIS, "regions": regions, "boundaries": boundaries}


def all_series(points: Sequence[Point]) -> list[dict[str, Any]]:
    grouped: dict[tuple, list[Point]] = defaultdict(list)
    for point in points:
        grouped[point.series].append(point)
    found, number = [], 1
    for key in sorted(grouped, key=repr):
        doc = series_regions(grouped[key], number)
        number += len(doc["regions"])
        found.append(doc)
    return found
