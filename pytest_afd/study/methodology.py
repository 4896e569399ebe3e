"""The bundle's profiler methodology, derived from the results (docs/profiling.md, RFC step 8).

Three facts a reader needs before trusting a headline figure:

- which runs are headline runs: measured without instrumentation
  (``settings.instrumented`` false); the tables and regions use only those;
- what instrumentation costs: each profiled case's ``profiler_overhead``
  (its one instrumented run's wall time over the median of its uninstrumented
  repetitions, recorded in ``evidence.profile`` or ``evidence.profiler_overhead``),
  and for a case measured entirely under the profiler, its throughput against an
  uninstrumented twin (same stack, same case id);
- the profiler schedule: the one each profile recorded, else the AFD plugin's
  defaults and the rule the harness uses (``pytest_afd.profiling.schedule``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_afd.profiling.schedule import PLUGIN_DEFAULTS, PLUGIN_REVISION
from pytest_afd.report.tables import table
from pytest_afd.report.values import median_of
from pytest_afd.results.documents import is_absent
from pytest_afd.results.manifest import stack_digest
from pytest_afd.study.limitations import has_profile, is_instrumented

RECORDED = "recorded by the case (instrumented run / uninstrumented median wall time)"
TWIN = "uninstrumented twin's tokens/s / this case's tokens/s"
SCHEDULE_KEYS = ("skip_first", "wait", "warmup", "active", "repeat")


def _recorded_overhead(doc: Mapping[str, Any]) -> float | None:
    profile = doc["evidence"].get("profile")
    if isinstance(profile, Mapping) and not is_absent(profile):
        overhead = profile.get("profiler_overhead")
        if isinstance(overhead, Mapping) and "ratio" in overhead:
            return float(overhead["ratio"])
    value = doc["evidence"].get("profiler_overhead")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _twins(docs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(stack_digest(d["manifest"]), d["case_id"]): d for d in docs if not is_instrumented(d)}


def overhead_rows(docs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """(case, overhead ratio, how it was derived) for every profiled or instrumented case."""
    twins = _twins(docs)
    rows = []
    for doc in sorted(docs, key=lambda d: d["case_id"]):
        recorded = _recorded_overhead(doc) if has_profile(doc) or "profiler_overhead" in doc[
            "evidence"] else None
        if recorded is not None:
            rows.append([doc["case_id"], f"{recorded:.3f}", RECORDED])
        elif is_instrumented(doc):
            twin = twins.get((stack_digest(doc["manifest"]), doc["case_id"]))
            mine = median_of(doc["metrics"]["prefill_tokens_per_s"])
            theirs = None if twin is None else median_of(twin["metrics"]["prefill_tokens_per_s"])
            ratio = f"{theirs / mine:.3f}" if mine and theirs else "-"
            rows.append([doc["case_id"], ratio, TWIN if twin else "no uninstrumented twin"])
    return rows


def schedules(docs: Sequence[Mapping[str, Any]]) -> list[dict[str, int]]:
    found: list[dict[str, int]] = []
    for doc in docs:
        profile = doc["evidence"].get("profile")
        schedule = profile.get("schedule") if isinstance(profile, Mapping) else None
        if isinstance(schedule, Mapping) and not is_absent(schedule):
            picked = {key: schedule[key] for key in SCHEDULE_KEYS if key in schedule}
            if picked not in found:
                found.append(picked)
    return found


def methodology_lines(docs: Sequence[Mapping[str, Any]]) -> list[str]:
    headline = [d for d in docs if not is_instrumented(d)]
    rows = overhead_rows(docs)
    ratios = [float(row[1]) for row in rows if row[1] != "-"]
    lines = [
        f"- Headline runs: {len(headline)} of {len(docs)} cases were measured without "
        "instrumentation; the regions, tested points and plots use only those (the cases "
        "table lists every case with its instrumented flag).",
        f"- Instrumented runs: {len(rows)} case(s) carry a profiled run"
        + (f"; profiler overhead (wall-time ratio) median {statistics.median(ratios):.3f}, "
           f"range {min(ratios):.3f}-{max(ratios):.3f}." if ratios else "."),
    ]
    if rows:
        lines += ["", *table(("case", "overhead", "derived from"), rows)]
    found = schedules(docs)
    lines.append("")
    if found:
        lines += ["- Profiler schedule as recorded by the profiles:", "",
                  *table(SCHEDULE_KEYS, [[str(s.get(k, "-")) for k in SCHEDULE_KEYS] for s in found])]
    else:
        lines.append("- Profiler schedule: no profile recorded one.")
    lines += ["", f"- The harness records exactly a case's measured steps: skip_first = the "
              "deployment's earlier steps, wait = warm-up steps - 1, warmup = 1, active = measured "
              f"steps, repeat = 1 (pytest_afd.profiling.schedule). AFD plugin defaults "
              f"({PLUGIN_REVISION}): "
              + "; ".join(f"{role} " + ", ".join(f"{k}={v}" for k, v in values.items())
                          for role, values in PLUGIN_DEFAULTS.items()) + "."]
    return lines
