"""What the runs concluded, first: Stage A's ranking and every stage's conclusion.

Pure functions over result documents, shared by the report (its leading
"Verdicts" section) and the plugin's terminal summary, so both say the same.
Stage A's answer is ``evidence.stage_a.ranking`` (leader, scores, verdict, the
leader-vs-runner-up interval); every stage's conclusion is its outcome counts,
the proposed / control throughput ratio per condition with how many ratios lie
beyond the noise, and stage evidence that names a choice (Stage D's best
chunk sizes).
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

STAGE_A_KEY = "stage_a"
RANKING_KEY = "ranking"
STAGE_D_BEST_KEY = "stage_d_best_sizes"
CONTROL_POLICY = "request_boundary"
PROPOSED_POLICY = "token_balanced"
STATUS_ORDER = ("passed", "failed", "error", "skipped")
UNKNOWN = "unknown"
INSIDE_NOISE = "inside the noise"
BEYOND_NOISE = "beyond the noise"


def _measured(doc: Mapping[str, Any]) -> list[float]:
    value = doc["metrics"]["prefill_tokens_per_s"]
    if not isinstance(value, Mapping) or "repetitions" not in value:
        return []
    return [float(v) for v in value["repetitions"]]


def _cv(values: Sequence[float]) -> float:
    if len(values) < 2:  # noqa: PLR2004 - a spread needs two values
        return 0.0
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(variance) / abs(mean) if mean else 0.0


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def noise_mark(control: Sequence[float], proposed: Sequence[float]) -> str:
    """Whether proposed / control lies beyond the repetitions' noise.

    Beyond means both: the min-max ranges do not overlap and the ratio is
    further from 1 than either side's coefficient of variation.
    """
    if not control or not proposed:
        return INSIDE_NOISE
    ratio = _median(proposed) / _median(control)
    apart = max(control) < min(proposed) or max(proposed) < min(control)
    if apart and abs(ratio - 1) > max(_cv(control), _cv(proposed)):
        return BEYOND_NOISE
    return INSIDE_NOISE


def _condition(doc: Mapping[str, Any]) -> str:
    """The case id without its policy segment: the condition both policies ran."""
    case_id = doc["case_id"]
    policy = doc["settings"]["split_policy"]
    return case_id.removesuffix(f"/{policy}")


def policy_ratios(docs: Sequence[Mapping[str, Any]]) -> list[tuple[str, float, str]]:
    """(condition, proposed / control median throughput, noise mark) per shared condition."""
    sides: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for doc in docs:
        policy = doc["settings"]["split_policy"]
        if policy in (CONTROL_POLICY, PROPOSED_POLICY) and _measured(doc):
            sides[_condition(doc)][policy] = _measured(doc)
    rows = []
    for condition, found in sorted(sides.items()):
        if len(found) == 2:  # noqa: PLR2004 - both policies
            control, proposed = found[CONTROL_POLICY], found[PROPOSED_POLICY]
            rows.append((condition, _median(proposed) / _median(control),
                         noise_mark(control, proposed)))
    return rows


def stage_a_rankings(docs: Iterable[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """(test, ranking) for each Stage A test that ranked the policies."""
    found: dict[str, Mapping[str, Any]] = {}
    for doc in docs:
        stage_a = doc["evidence"].get(STAGE_A_KEY)
        if isinstance(stage_a, Mapping) and RANKING_KEY in stage_a:
            test = doc["case_id"].rsplit("/", 2)[0].rpartition("::")[2] or doc["case_id"]
            found.setdefault(test, stage_a[RANKING_KEY])
    return sorted(found.items())


def ranking_text(ranking: Mapping[str, Any]) -> str:
    """``no significant difference: leader token_balanced 1.02 (interval 0.97–1.08), ...``."""
    scores = ", ".join(f"{p} {s:.3g}" for p, s in sorted(ranking["scores"].items(),
                                                          key=lambda item: -item[1]))
    text = f"{ranking['verdict']}: leader {ranking['leader']}"
    versus = ranking.get("leader_vs_runner_up")
    if versus:
        low, high = versus["interval"]
        text += (f" over {ranking['runner_up']} x{versus['ratio']:.3g} "
                 f"({versus['confidence']:.0%} interval {low:.3g}–{high:.3g})")
    return f"{text}; scores (throughput / baseline, geometric mean): {scores}"


def outcome_counts(docs: Iterable[Mapping[str, Any]]) -> str:
    counts = Counter((doc.get("outcome") or {}).get("status", UNKNOWN) for doc in docs)
    order = [*STATUS_ORDER, UNKNOWN]
    return ", ".join(f"{counts[s]} {s}" for s in order if counts[s])


def stage_conclusion(docs: Sequence[Mapping[str, Any]]) -> str:
    """One line: outcomes, the proposed / control ratios against the noise, named choices."""
    parts = [f"{len(docs)} case(s): {outcome_counts(docs)}"]
    ratios = policy_ratios(docs)
    if ratios:
        beyond = [r for _, r, mark in ratios if mark == BEYOND_NOISE]
        geomean = math.exp(sum(math.log(r) for _, r, _ in ratios) / len(ratios))
        parts.append(
            f"{PROPOSED_POLICY} / {CONTROL_POLICY} geometric mean {geomean:.3g} over "
            f"{len(ratios)} condition(s), {len(beyond)} beyond the noise "
            f"({sum(r > 1 for r in beyond)} faster, {sum(r < 1 for r in beyond)} slower)"
        )
    best = {tuple(doc["evidence"][STAGE_D_BEST_KEY]) for doc in docs
            if isinstance(doc["evidence"].get(STAGE_D_BEST_KEY), list)}
    for sizes in sorted(best):
        parts.append("best chunk sizes " + ", ".join(map(str, sizes)))
    return "; ".join(parts)


def by_stage(docs: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    stages: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for doc in docs:
        stages[doc["case_kind"]].append(doc)
    return dict(stages)


def summary_lines(docs: Sequence[Mapping[str, Any]], stage_order: Sequence[str]) -> list[str]:
    """Plain-text verdict lines (the terminal summary): Stage A first, then each stage."""
    lines = [f"Stage A ({test}): {ranking_text(ranking)}"
             for test, ranking in stage_a_rankings(docs)]
    stages = by_stage(docs)
    for stage in sorted(stages, key=lambda s: (stage_order.index(s) if s in stage_order
                                               else len(stage_order), s)):
        lines.append(f"{stage}: {stage_conclusion(stages[stage])}")
    return lines


def summary_lines_from_files(paths: Iterable[str], stage_order: Sequence[str]) -> list[str]:
    """:func:`summary_lines` of the result files a session wrote (unreadable ones left out)."""
    docs = []
    for path in paths:
        try:
            docs.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError):
            continue
    return summary_lines(docs, stage_order) if docs else []
