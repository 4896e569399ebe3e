"""``study select-references``: the stable reference cases of Stage A (RFC step 4).

A Stage A case is a **reference** when its prefill throughput is stable:

- within each session, the coefficient of variation of its measured repetitions
  is at most :data:`MAX_CV`, and
- between two sessions, its medians differ by at most
  :data:`MAX_SESSION_DIFFERENCE` of their mean (one session: not applied, and
  the criterion says so).

Every other case is **rejected** with its reason (unstable, missing from a
session, too few repetitions, not passed, contradicting the study). The
reference *configuration* the later stages use is the Stage A winner (in every
session) or else the RFC's candidate ``token_balanced``, on the workload whose
candidate and control cases are both references with the lowest spread. When
Stage D main-sweep results are given too, the two fastest stable chunk sizes are
frozen as well, so Stage D's follow-ups run the same sizes in every session.
The result is a new study (``parent_digest`` = the input study's digest).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_afd.study.check import contradictions
from pytest_afd.study.document import StudyError, derive, load_study, write_study

# With 3 repetitions the median's standard error is about 1.25 * CV / sqrt(3) ~ 0.72 CV;
# resolving a 10 % difference between two cases at two standard errors of their
# difference (2 * sqrt(2) * 0.72 CV <= 0.10) needs CV <= ~0.05.
MAX_CV = 0.05
# A reference that moves more than 5 % between sessions of the same code moves
# every later stage's baseline by more than the 10 % effects the stages resolve
# would tolerate at half their size.
MAX_SESSION_DIFFERENCE = 0.05
MAX_SESSIONS = 2  # the RFC's "two sessions": the latest two are used
MIN_REPETITIONS = 3  # the protocol's minimum (pytest_afd.stats.repetitions.MIN_REPETITIONS)
THROUGHPUT = "prefill_tokens_per_s"
CANDIDATE_POLICY = "token_balanced"
CONTROL_POLICY = "request_boundary"
BASELINE_POLICY = "none"
STAGE_A = "stage_a"
STAGE_D = "stage_d"
SWEEP_MARK = "/sweep/"  # Stage D main-sweep case names (suites/stage_d)
BEST_CHUNKS = 2
PASSED = ("passed",)
DESCRIPTION = (
    "Read Stage A results (one or two sessions; Stage D main-sweep results may be given too) "
    "and write a new study (parent_digest set) holding the stable reference cases with their "
    "figures, the rejected ones with reasons and the reference configuration stages B-E use. "
    f"Stable: repetition CV <= --max-cv (default {MAX_CV}) in every session and, with two "
    f"sessions, medians within --max-session-difference (default {MAX_SESSION_DIFFERENCE}) "
    "of their mean (docs/study.md)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", metavar="RESULTS_DIR",
                        help="results directories holding Stage A (and optionally Stage D) runs")
    parser.add_argument("--study", required=True, help="the frozen study to derive from")
    parser.add_argument("--output", required=True, help="the new study JSON")
    parser.add_argument("--max-cv", type=float, default=MAX_CV,
                        help="largest repetition CV of a stable case (a fraction; default %(default)s)")
    parser.add_argument("--max-session-difference", type=float, default=MAX_SESSION_DIFFERENCE,
                        help="largest relative difference of a case's median between two "
                        "sessions (a fraction; default %(default)s)")


def cv(values: Sequence[float]) -> float:
    """Sample standard deviation over mean (0 for equal values)."""
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else math.inf


def session_difference(medians: Sequence[float]) -> float | None:
    """(max - min) / mean of the sessions' medians; None with one session."""
    if len(medians) < MAX_SESSIONS:
        return None
    return (max(medians) - min(medians)) / statistics.fmean(medians)


def _repetitions(doc: Mapping[str, Any]) -> list[float] | None:
    metric = doc.get("metrics", {}).get(THROUGHPUT)
    if not isinstance(metric, Mapping) or not isinstance(metric.get("repetitions"), list):
        return None
    values = [float(v) for v in metric["repetitions"] if isinstance(v, int | float)]
    return values if len(values) == len(metric["repetitions"]) and values else None


def _status(doc: Mapping[str, Any]) -> str:
    outcome = doc.get("outcome")
    return outcome.get("status", "unknown") if isinstance(outcome, Mapping) else "unknown"


def read_results(directories: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every valid result document under ``directories`` (all sessions)."""
    from pytest_afd.report.loading import load_results  # lazy: the report's reader

    docs: list[dict[str, Any]] = []
    for directory in directories:
        path = Path(directory)
        if not path.is_dir():
            raise StudyError(f"results directory {path}: not a directory")
        docs += [dict(result.doc) for result in load_results(path).results]
    return docs


def latest_sessions(docs: Sequence[Mapping[str, Any]], kind: str) -> list[str]:
    """The (at most MAX_SESSIONS) newest sessions that wrote ``kind`` results, oldest first."""
    newest: dict[str, str] = {}
    for doc in docs:
        if doc.get("case_kind") == kind and doc.get("session_id"):
            session = doc["session_id"]
            newest[session] = max(newest.get(session, ""), doc["created_at"])
    return sorted(newest, key=lambda s: newest[s])[-MAX_SESSIONS:]


def distribution(doc: Mapping[str, Any]) -> str:
    """The case's workload distribution (``workload.spec``; the dataset name adds the order)."""
    spec = doc["workload"].get("spec")
    if isinstance(spec, Mapping) and spec.get("distribution"):
        return str(spec["distribution"])
    return str(doc["workload"]["dataset"]["name"])


def _figures(case_id: str, by_session: Mapping[str, Mapping[str, Any]], sessions: Sequence[str]
             ) -> tuple[dict[str, Any] | None, str | None]:
    """(figures, None) for a case measured in every session, else (None, reason)."""
    missing = [s for s in sessions if s not in by_session]
    if missing:
        return None, f"measured in {len(sessions) - len(missing)} of {len(sessions)} sessions"
    medians, cvs, count = [], [], None
    for session in sessions:
        doc = by_session[session]
        if _status(doc) not in PASSED:
            return None, f"its test did not pass in session {session} ({_status(doc)})"
        values = _repetitions(doc)
        if values is None:
            return None, f"no measured {THROUGHPUT} repetitions in session {session} (omitted?)"
        if min(values) <= 0:
            return None, f"a non-positive {THROUGHPUT} repetition in session {session}"
        if len(values) < MIN_REPETITIONS:
            return None, (f"{len(values)} repetition(s) in session {session}; the protocol "
                          f"needs at least {MIN_REPETITIONS}")
        medians.append(statistics.median(values))
        cvs.append(cv(values))
        count = len(values) if count is None else min(count, len(values))
    doc = by_session[sessions[-1]]
    return {
        "case_id": case_id,
        "policy": doc["settings"]["split_policy"],
        "workload": distribution(doc),
        "sessions": len(sessions),
        "repetitions": count,
        "median_tokens_per_s": statistics.median(medians),
        "session_medians": medians,
        "cv": max(cvs),
        "session_difference": session_difference(medians),
        "chunk_size": (doc["settings"].get("chunked_prefill") or {}).get("chunk_size"),
        "stage_scale": (doc["settings"].get("stage_sizes") or {}).get("scale"),
    }, None


def classify(study: Mapping[str, Any], docs: Sequence[Mapping[str, Any]], kind: str,
             max_cv: float, max_difference: float) -> tuple[list[dict], list[dict], list[str]]:
    """(selected, rejected, sessions) for the ``kind`` cases of the latest sessions."""
    sessions = latest_sessions(docs, kind)
    cases: dict[str, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    rejected: list[dict[str, Any]] = []
    for doc in docs:
        if doc.get("case_kind") != kind or doc.get("session_id") not in sessions:
            continue
        found = contradictions(study, doc["manifest"])
        if found:
            rejected.append({"case_id": doc["case_id"], "session": doc["session_id"],
                             "reason": "contradicts the frozen study: "
                                       + "; ".join(c.describe() for c in found)})
            continue
        cases[doc["case_id"]][doc["session_id"]] = doc
    excluded = {item["case_id"] for item in rejected}
    selected = []
    for case_id in sorted(set(cases) - excluded):
        figures, reason = _figures(case_id, cases[case_id], sessions)
        if figures is not None:
            reason = _instability(figures, max_cv, max_difference)
        if reason is None:
            selected.append(figures)
        else:
            rejected.append({"case_id": case_id, "reason": reason,
                             **({"figures": figures} if figures else {})})
    return selected, rejected, sessions


def _instability(figures: Mapping[str, Any], max_cv: float, max_difference: float) -> str | None:
    reasons = []
    if figures["cv"] > max_cv:
        reasons.append(f"repetition CV {figures['cv']:.3f} > {max_cv}")
    difference = figures["session_difference"]
    if difference is not None and difference > max_difference:
        reasons.append(f"session-to-session difference {difference:.3f} > {max_difference}")
    return "; ".join(reasons) or None


def _winner(docs: Sequence[Mapping[str, Any]], sessions: Sequence[str]) -> str | None:
    """The Stage A winner when every session's matrix named the same significant one."""
    winners = set()
    for session in sessions:
        named = {((doc.get("evidence", {}).get("stage_a") or {}).get("ranking") or {}).get("winner")
                 for doc in docs
                 if doc.get("session_id") == session and doc.get("case_kind") == STAGE_A}
        named.discard(None)
        winners.add(next(iter(named)) if len(named) == 1 else None)
    winner = winners.pop() if len(winners) == 1 else None
    return None if winner in (None, BASELINE_POLICY) else winner


def reference_configuration(selected: Sequence[Mapping[str, Any]], winner: str | None
                            ) -> dict[str, Any]:
    """The workload and policies stages B-E use, and why; ``workload`` None when none is stable."""
    policy = winner or CANDIDATE_POLICY
    control = CANDIDATE_POLICY if policy == CONTROL_POLICY else CONTROL_POLICY
    why_policy = (f"Stage A's winner in every session ({winner})" if winner
                  else f"no policy won Stage A in every session: the RFC's candidate {policy}")
    by_workload: dict[str, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for case in selected:
        by_workload[case["workload"]].setdefault(case["policy"], case)
    options = [(max(cases[policy]["cv"], cases[control]["cv"]), workload)
               for workload, cases in by_workload.items()
               if policy in cases and control in cases]
    if not options:
        return {"workload": None, "policy": policy, "control_policy": control,
                "case_ids": [], "reason": f"{why_policy}; no workload has both its {policy} and "
                                          f"{control} cases stable"}
    spread, workload = min(options)
    cases = by_workload[workload]
    return {"workload": workload, "policy": policy, "control_policy": control,
            "case_ids": [cases[policy]["case_id"], cases[control]["case_id"]],
            "reason": f"{why_policy}; workload {workload}: the lowest spread (CV {spread:.3f}) "
                      f"of the workloads whose {policy} and {control} cases are stable"}


def chunk_references(selected: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The two fastest stable Stage D sweep sizes, in logical (full-scale) tokens."""
    chunked = [case for case in selected
               if SWEEP_MARK in case["case_id"] and case["chunk_size"] is not None
               and case["stage_scale"]]
    if not chunked:
        return None
    best = sorted(chunked, key=lambda c: (-c["median_tokens_per_s"], c["chunk_size"]))
    best = best[:BEST_CHUNKS]
    return {"logical_chunk_sizes": [round(c["chunk_size"] / c["stage_scale"]) for c in best],
            "case_ids": [c["case_id"] for c in best],
            "reason": f"the {len(best)} fastest stable chunk sizes of the Stage D main sweep "
                      "(median over sessions)"}


def select(study: Mapping[str, Any], docs: Sequence[Mapping[str, Any]], max_cv: float = MAX_CV,
           max_difference: float = MAX_SESSION_DIFFERENCE) -> dict[str, Any]:
    """The study's ``references`` object for these results."""
    selected, rejected, sessions = classify(study, docs, STAGE_A, max_cv, max_difference)
    if not sessions:
        raise StudyError("no Stage A result (case_kind stage_a with a session id) in the given "
                         "results directories")
    d_selected, d_rejected, _ = classify(study, docs, STAGE_D, max_cv, max_difference)
    single = len(sessions) < MAX_SESSIONS
    return {
        "criterion": {
            "max_cv": max_cv,
            "max_session_difference": max_difference,
            "text": f"repetition CV of {THROUGHPUT} <= {max_cv} in every session"
                    + (" (one session: the between-session criterion could not be applied)"
                       if single else f" and session medians within {max_difference} of their "
                                      "mean"),
        },
        "sessions": sessions,
        "selected": selected,
        "rejected": rejected,
        "reference": reference_configuration(selected, _winner(docs, sessions)),
        "chunks": chunk_references(d_selected),
        "chunk_rejected": d_rejected,
    }


def main(args: argparse.Namespace) -> int:
    try:
        study = load_study(args.study)
        references = select(study, read_results(args.results), args.max_cv,
                            args.max_session_difference)
        child = derive(study, references=references)
        path = write_study(child, args.output)
    except StudyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    reference = references["reference"]
    print(f"{path}: study {child['name']!r} {child['digest']} (parent {study['digest']})")
    print(f"  {len(references['selected'])} reference case(s), {len(references['rejected'])} "
          f"rejected, sessions {', '.join(references['sessions'])}")
    print(f"  reference: {reference['policy']} vs {reference['control_policy']} on "
          f"{reference['workload']} ({reference['reason']})")
    return 0
