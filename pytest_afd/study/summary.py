"""The bundle's summary (``study.md``, rendered to ``study.html``) and its region/point tables.

Everything here is made from ``regions.json``'s own series documents and
the included results, so the page, the CSV tables and regions.json cannot
say different things (tests/study/test_publish.py checks it). The first line
is the headline: whether the bundle makes a production recommendation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_afd.report.tables import table
from pytest_afd.study import effects
from pytest_afd.study.bundle import CASE_HEADER, SUMS_FILE, case_rows
from pytest_afd.study.limitations import Exclusion, Limitation

REGION_HEADER = ("region", "series", "label", "imbalance low", "imbalance high", "hit low",
                 "hit high", "workloads", "chunk size", "batch tokens", "topology", "call",
                 "recommendation", "tokens/s ratio", "tokens/s low", "tokens/s high",
                 "TTFT p50 ratio", "TTFT low", "TTFT high", "cases")
POINT_HEADER = ("region", "series", "condition", "realized imbalance", "tokens/s ratio",
                "tokens/s low", "tokens/s high", "TTFT p50 ratio", "TTFT low", "TTFT high",
                "call", "cases")
NONE = "-"
METHOD_TEXT = (
    "Each tested point pairs request_boundary (control) and token_balanced (proposed) on one "
    "condition, uninstrumented and passed, all sessions pooled. Its effect is the ratio of "
    "geometric means of the repetitions with Welch's {confidence:.0%} interval on the log "
    "repetitions, computed once at publication (not re-checked per repetition). A point calls "
    "token_balanced (or request_boundary) only when the interval excludes 1 and the effect "
    "exceeds {effect:.0%}; 'no difference' when the interval lies within ±{effect:.0%}; "
    "otherwise it is undecided. A region is a maximal run of adjacent points (ordered by the "
    "realized imbalance of request_boundary's split) with the same call; its effect pools its "
    "points' log ratios. A boundary lies between the last tested point of one region and the "
    "first of the next: nothing between them was measured. The intervals hold for the sessions "
    "measured: with one session they do not cover between-session noise (see the limitations); "
    "the stage report's 'beyond the between-session noise' verdicts use that stricter "
    "cross-session rule."
)


def _number(value: Any, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else NONE


def _interval_cells(interval: Any) -> list[str]:
    if isinstance(interval, Mapping) and "ratio" in interval:
        return [_number(interval["ratio"]), _number(interval["low"]), _number(interval["high"])]
    return [NONE, NONE, NONE]


def _range_cells(value: Any) -> list[str]:
    if isinstance(value, Mapping) and "low" in value:
        return [_number(value["low"]), _number(value["high"])]
    return [NONE, NONE]


def interval_text(interval: Any) -> str:
    if isinstance(interval, Mapping) and "ratio" in interval:
        return f"x{interval['ratio']:.3f} [{interval['low']:.3f}, {interval['high']:.3f}]"
    return "unknown (" + interval["absent_reason"] + ")" if isinstance(interval, Mapping) else NONE


def region_rows(series_docs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for index, series in enumerate(series_docs, 1):
        for region in series["regions"]:
            c = region["conditions"]
            rows.append([region["id"], str(index), region["label"],
                         *_range_cells(c["realized_imbalance"]), *_range_cells(c["prefix_hit"]),
                         " ".join(c["workloads"]),
                         NONE if c["chunk_size"] is None else str(c["chunk_size"]),
                         str(c["batch_tokens"]), str(c["topology"]), region["call"],
                         region["recommendation"],
                         *_interval_cells(region["effect"]["prefill_tokens_per_s"]),
                         *_interval_cells(region["effect"]["ttft_p50"]),
                         " ".join(region["cases"])])
    return rows


def point_rows(series_docs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    return [[region["id"], str(index), point["condition"], _number(point["realized_imbalance"]),
             *_interval_cells(point["prefill_tokens_per_s"]), *_interval_cells(point["ttft_p50"]),
             point["call"], " ".join(point["cases"])]
            for index, series in enumerate(series_docs, 1)
            for region in series["regions"] for point in region["points"]]


def _boundary_lines(series: Mapping[str, Any]) -> list[str]:
    return [f"- Boundary {b['from_region']} ({b['from_call']}) → {b['to_region']} ({b['to_call']}): "
            f"realized imbalance between {b['between'][0]:.3f} and {b['between'][1]:.3f} "
            "(the tested points either side; nothing between them was measured)."
            for b in series["boundaries"]]


def _region_sentence(region: Mapping[str, Any]) -> str:
    c = region["conditions"]
    imbalance = c["realized_imbalance"]
    where = (f"realized imbalance {imbalance['low']:.3f}–{imbalance['high']:.3f}"
             if "low" in imbalance else f"workload {', '.join(c['workloads'])}")
    effect = region["effect"]
    return (f"- **{region['id']}** ({region['label']}), {where}: {region['recommendation']} "
            f"({region['call']}); tokens/s {interval_text(effect['prefill_tokens_per_s'])}, "
            f"TTFT p50 {interval_text(effect['ttft_p50'])}; cases: {len(region['cases'])}.")


def regions_section(series_docs: Sequence[Mapping[str, Any]],
                    plots: Mapping[int, tuple[str, str]]) -> list[str]:
    lines = ["## Operating regions", ""]
    if not series_docs:
        return [*lines, "No region: no condition measured both policies.", ""]
    for index, series in enumerate(series_docs, 1):
        c = series["conditions"]
        lines += [f"### Series {index}: {c['stage']}, {c['stack']}", "",
                  f"Fixed: topology {c['topology']}, {c['layers']} layers, routing {c['routing']}, "
                  f"chunk {c['chunk_size'] or 'unchunked'}, {c['batch_tokens']} batch tokens, "
                  f"requested hit {c['requested_hit'] if c['requested_hit'] is not None else NONE}.",
                  ""]
        for region in series["regions"]:
            lines += [_region_sentence(region), ""]
        for line in _boundary_lines(series):
            lines += [line, ""]
        if index in plots:
            path, caption = plots[index]
            lines += [f"![{caption}]({path})", "", f"*{caption}.*", ""]
    shown = [[*row[:-1], str(len(row[-1].split()))] for row in region_rows(series_docs)]
    lines += ["### All regions", "", "Supporting case ids: regions.json and tables/regions.csv; "
              "per point: the tested-points table.", "",
              *table((*REGION_HEADER[:-1], "supporting cases"), shown), ""]
    return lines


def limitation_lines(limitations: Sequence[Limitation], exclusions: Sequence[Exclusion]) -> list[str]:
    lines = ["## Limitations", "", "Derived from the evidence (tests/study/test_limitations.py).", ""]
    lines += [line for item in limitations for line in (f"- {item.text}", "")]
    if exclusions:
        rows = [[e.case_id, e.source, c.field, repr(c.study_value), repr(c.run_value)]
                for e in exclusions for c in e.fields]
        lines += ["### Excluded results", "",
                  *table(("case", "file", "field", "study", "run"), rows), ""]
    return lines


def render(*, headline: str, study: Mapping[str, Any], counts: Mapping[str, int],
           series_docs: Sequence[Mapping[str, Any]], plots: Mapping[int, tuple[str, str]],
           limitations: Sequence[Limitation], exclusions: Sequence[Exclusion],
           docs: Sequence[Mapping[str, Any]], methodology: Sequence[str],
           raw: Sequence[tuple[str, str]], unusable: Sequence[tuple[str, str]]) -> str:
    lines = [headline, "", f"# Study {study['name']}", "",
             f"Study `{study['digest']}` (frozen {study.get('frozen_at', NONE)}): "
             f"{counts['read']} results read, {counts['included']} included, "
             f"{counts['excluded']} excluded for contradicting the study, "
             f"{counts['unusable']} unusable.", ""]
    lines += regions_section(series_docs, plots)
    lines += limitation_lines(limitations, exclusions)
    lines += ["## Tested points", "",
              "Per-stage tables and plots of every included case (the report's): "
              "`report/report.html` (and `report/report.md`).", "", *table(POINT_HEADER, point_rows(series_docs)), "",
              "## Cases", "", *table(CASE_HEADER, case_rows(docs)), "",
              "## Profiler methodology", "", *methodology, "",
              "## Method", "", METHOD_TEXT.format(confidence=effects.CONFIDENCE,
                                                 effect=effects.MIN_EFFECT), "",
              "## Raw results and digests", "",
              f"Every result read is copied byte for byte under `raw/`; `{SUMS_FILE}` lists the "
              f"sha256 of every file of the bundle (`sha256sum -c {SUMS_FILE}`).", "",
              *table(("file", "sha256"), [list(item) for item in raw]), ""]
    if unusable:
        lines += ["### Unusable files", "", *table(("file", "reason"), [list(u) for u in unusable]),
                  ""]
    return "\n".join(lines)
