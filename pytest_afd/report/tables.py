"""Markdown tables of one stack: every case with its verdict, the policy comparison,
the workloads, and Stage F's AFD-vs-PP pairs side by side."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pytest_afd.report.loading import LoadedResult, verdict_rank
from pytest_afd.report.values import (
    PERCENT,
    TTFT_PERCENTILE_KEYS,
    arrival_process,
    case_id_prefix,
    chunk_validity,
    condition_labels,
    hit_ratios,
    measured_stats,
    median_of,
    natural_key,
    rank_skew,
    repetitions_of,
    short_case_id,
    stack_short_label,
    step_imbalances,
    throughput,
    ttft_of,
)
from pytest_afd.results.documents import is_absent
from pytest_afd.stats.session_noise import UNCALIBRATED_RULE, WITHIN_RULE, same_session
from pytest_afd.stats.verdicts import INSIDE_NOISE, noise_mark

DIGEST_SHORT_CHARS = 12  # after the "sha256:" prefix
DIGEST_PREFIX = "sha256:"
BYTES_PER_MIB = 1024 * 1024
VERDICT_REASON_CHARS = 80
EMPTY = "—"
# The RFC's control and its proposal: their ratio is the headline comparison.
CONTROL_POLICY = "request_boundary"
PROPOSED_POLICY = "token_balanced"
TABLE_HEADER = (
    "case",
    "verdict",
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
    "warm cache: uncached p50 / max",
)
PAIR_HEADER = (
    "pair",
    "AFD layout",
    "PP layout",
    "AFD tokens/s",
    "PP tokens/s",
    "AFD / PP",
    "AFD TTFT p50 (s)",
    "PP TTFT p50 (s)",
    "parity",
)


def short_digest(digest: str) -> str:
    return digest.removeprefix(DIGEST_PREFIX)[:DIGEST_SHORT_CHARS]


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return EMPTY
    return f"{value:.{digits}g}"


def fmt_measure(value: Any) -> str:
    stats = measured_stats(value)
    if stats is None:
        return EMPTY
    cv = EMPTY if stats["cv"] is None else f"{stats['cv'] * PERCENT:.1f}%"
    return f"{stats['median']:.4g} (cv {cv}, n={stats['n']})"


def fmt_ratio(value: float | None) -> str:
    return EMPTY if value is None else f"{value * PERCENT:.1f}%"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]


def labels_text(doc: Mapping[str, Any]) -> str:
    labels = doc["labels"]
    parts = []
    if labels["synthetic"]:
        parts.append("synthetic")
    if labels["comparability"] == "exploratory":
        reason = labels.get("comparability_reason")
        parts.append(f"exploratory ({reason})" if reason else "exploratory")
    return ", ".join(parts) or EMPTY


def verdict_text(result: LoadedResult) -> str:
    """The test outcome; failures carry the first line of their reason."""
    reason = (result.reason or "").strip().splitlines()
    if result.status in ("passed", "unknown") or not reason:
        return result.status
    first = reason[0]
    if len(first) > VERDICT_REASON_CHARS:
        first = first[: VERDICT_REASON_CHARS - 1] + "…"
    return f"{result.status}: {first}"


def _tokens_text(doc: Mapping[str, Any]) -> str:
    tokens = doc["evidence"]["tokens"]
    if is_absent(tokens):
        return EMPTY
    return (
        f"{tokens['logical_prompt_tokens']} / {tokens['scheduled_real_tokens']} / "
        f"{tokens['padded_tokens']}"
    )


def _count_text(value: Any) -> str:
    return EMPTY if is_absent(value) else str(value)


def _row(result: LoadedResult, condition: str, prefix: str) -> list[str]:
    doc = result.doc
    metrics = doc["metrics"]
    imbalances = step_imbalances(doc)
    requested, realized = hit_ratios(doc)
    valid, reason = chunk_validity(doc)
    labels = labels_text(doc) if valid else f"invalid chunk size: {reason}"
    rate = throughput(doc)
    if valid and is_absent(rate):
        labels = rate["absent_reason"] if labels == EMPTY else f"{labels}; {rate['absent_reason']}"
    memory = median_of(metrics["peak_memory_bytes"])
    tails = " / ".join(fmt(median_of(ttft_of(doc, key)), 4) for key in TTFT_PERCENTILE_KEYS[1:])
    p50 = median_of(ttft_of(doc, "p50"))
    if p50 is not None and all(median_of(ttft_of(doc, key)) == p50
                               for key in TTFT_PERCENTILE_KEYS[1:]):
        tails = f"= p50 ({arrival_process(doc)})"
    return [
        short_case_id(result, prefix),
        verdict_text(result),
        result.dataset,
        result.policy,
        condition,
        fmt_measure(rate),
        fmt_measure(ttft_of(doc, "p50")),
        tails,
        fmt_measure(metrics["request_throughput"]),
        f"{_count_text(metrics['completed_requests'])}/{_count_text(metrics['failed_requests'])}",
        fmt(None if memory is None else memory / BYTES_PER_MIB, 4),
        _tokens_text(doc),
        f"{fmt_ratio(float(np.mean(imbalances)) if imbalances else None)} / "
        f"{fmt_ratio(max(imbalances) if imbalances else None)}",
        f"{fmt_ratio(requested)} / {fmt_ratio(realized)}",
        fmt(rank_skew(doc)),
        labels,
    ]


def case_table(results: Sequence[LoadedResult]) -> list[str]:
    """Every case, failures first, then by condition and policy."""
    labels = condition_labels(results)
    prefix = case_id_prefix(results)
    lines = [f"Case ids below follow `{prefix}`.", ""] if prefix else []
    ordered = sorted(
        results,
        key=lambda r: (verdict_rank(r), natural_key(labels[r.case_id]), r.policy, r.case_id),
    )
    rows = []
    for result in ordered:
        condition = labels[result.case_id].removeprefix(result.dataset).strip() or EMPTY
        rows.append(_row(result, condition, prefix))
    return lines + table(TABLE_HEADER, rows)


def comparison_table(results: Sequence[LoadedResult]) -> list[str]:
    """Median prefill tokens/s per condition x policy, plus proposed / control."""
    policies = sorted({r.policy for r in results})
    if len(policies) < 2:  # noqa: PLR2004 - a comparison needs two policies
        return []
    labels = condition_labels(results)
    cells = {(labels[r.case_id], r.policy): median_of(throughput(r.doc)) for r in results}
    reps = {(labels[r.case_id], r.policy): repetitions_of(throughput(r.doc)) for r in results}
    docs = {(labels[r.case_id], r.policy): r.doc for r in results}
    with_ratio = CONTROL_POLICY in policies and PROPOSED_POLICY in policies
    header = ["condition", *policies]
    if with_ratio:
        header.append(f"{PROPOSED_POLICY} / {CONTROL_POLICY}")
    rows = []
    for condition in sorted(set(labels.values()), key=natural_key):
        row = [condition, *(fmt(cells.get((condition, p)), 4) for p in policies)]
        if with_ratio:
            proposed = cells.get((condition, PROPOSED_POLICY))
            control = cells.get((condition, CONTROL_POLICY))
            ratio = fmt(proposed / control if proposed and control else None, 3)
            sides = [docs[key] for key in ((condition, CONTROL_POLICY),
                                           (condition, PROPOSED_POLICY)) if key in docs]
            mark = noise_mark(reps.get((condition, CONTROL_POLICY), []),
                              reps.get((condition, PROPOSED_POLICY), []),
                              within=len(sides) == 2 and same_session(*sides))  # noqa: PLR2004
            row.append(f"{ratio} ({mark})" if ratio != EMPTY else ratio)
        rows.append(row)
    note = (f"{PROPOSED_POLICY} / {CONTROL_POLICY} is {INSIDE_NOISE} unless, {WITHIN_RULE}; "
            "across sessions, unless the min-max ranges of the repetitions do not overlap and "
            f"the ratio lies beyond the between-session noise ({UNCALIBRATED_RULE}).")
    return ["Median prefill tokens/s per policy:", "", *table(header, rows), "",
            *([note, ""] if with_ratio else [])]


def _uncached_text(workload: Mapping[str, Any]) -> str:
    """What a warm cache leaves to compute (hit-ratio twins share their prompt lengths)."""
    uncached = workload.get("uncached_prompt_lengths")
    if not isinstance(uncached, Mapping) or workload.get("shared_prefix_tokens", 0) == 0:
        return EMPTY
    return f"{fmt(uncached['p50'], 5)} / {fmt(uncached['max'], 5)}"


def workload_table(results: Sequence[LoadedResult]) -> list[str]:
    """Prompt-length statistics of every dataset the stack ran (Stage C asks for them)."""
    seen: dict[tuple[str, str], Mapping[str, Any]] = {}
    arrivals: dict[tuple[str, str], str] = {}
    for result in results:
        workload = result.doc["workload"]
        digest = workload["dataset"]["digest"]
        digest_text = EMPTY if is_absent(digest) else str(digest)[:DIGEST_SHORT_CHARS]
        seen.setdefault((result.dataset, digest_text), workload)
        arrivals.setdefault((result.dataset, digest_text), arrival_process(result.doc))
    rows = []
    for key, workload in sorted(seen.items()):
        lengths = workload["prompt_lengths"]
        total = sum(lengths["values"]) if "values" in lengths else None
        rows.append(
            [
                key[0],
                f"`{key[1]}`",
                str(workload["request_count"]),
                fmt(total, 8),
                *(fmt(lengths[k], 5) for k in ("mean", "p50", "p90", "p99", "cv", "min", "max")),
                arrivals[key],
                _uncached_text(workload),
            ]
        )
    return table(WORKLOAD_HEADER, rows)


# --- Stage F: AFD vs PP pairs ------------------------------------------------------------------
PARITY_KEY = "parity"


def pair_role(result: LoadedResult) -> str | None:
    """ "afd" or "pp" for a result carrying parity evidence (by its recorded layouts)."""
    parity = result.doc["evidence"].get(PARITY_KEY)
    if not isinstance(parity, Mapping) or "reference" not in parity:
        return None
    reference = parity["reference"]
    topology = result.doc["manifest"]["topology"]["canonical"]
    segments = result.case_id.split("/")
    if topology == reference.get("afd_layout") or "afd" in segments:
        return "afd"
    if topology == reference.get("pp_layout") or "pp" in segments:
        return "pp"
    return None


def afd_pp_pairs(results: Sequence[LoadedResult]) -> list[tuple[str, LoadedResult, LoadedResult]]:
    """(pair name, AFD result, PP result) for each test that measured one pair."""
    sides: dict[str, dict[str, LoadedResult]] = defaultdict(dict)
    for result in results:
        role = pair_role(result)
        if role is not None:
            parent = result.case_id.rsplit("/", 2)[0]
            sides[parent][role] = result
    pairs = []
    for parent, found in sorted(sides.items()):
        if "afd" in found and "pp" in found:
            name = parent.rpartition("::")[2] or parent
            pairs.append((name, found["afd"], found["pp"]))
    return pairs


def parity_text(result: LoadedResult) -> str:
    labels = result.doc["labels"]
    if labels["comparability"] == "comparable":
        return "comparable"
    reason = labels.get("comparability_reason")
    return f"exploratory: {reason}" if reason else "exploratory"


def pair_table(pairs: Sequence[tuple[str, LoadedResult, LoadedResult]]) -> list[str]:
    rows = []
    for name, afd, pp in pairs:
        afd_rate, pp_rate = median_of(throughput(afd.doc)), median_of(throughput(pp.doc))
        rows.append(
            [
                name,
                stack_short_label(afd.doc),
                stack_short_label(pp.doc),
                fmt_measure(throughput(afd.doc)),
                fmt_measure(throughput(pp.doc)),
                fmt(afd_rate / pp_rate if afd_rate and pp_rate else None),
                fmt_measure(ttft_of(afd.doc, "p50")),
                fmt_measure(ttft_of(pp.doc, "p50")),
                parity_text(afd),
            ]
        )
    return table(PAIR_HEADER, rows)
