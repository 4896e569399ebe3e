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

from pytest_afd.stats import conclusions, session_noise

STAGE_A_KEY = "stage_a"
RANKING_KEY = "ranking"
STAGE_D_BEST_KEY = "stage_d_best_sizes"
STAGE_D_BEST_SOURCE_KEY = "stage_d_best_sizes_source"  # suites/stage_d: whose sizes they are
SWEEP_SOURCE = "this session's sweep"
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


_median = session_noise.median


def noise_mark(control: Sequence[float], proposed: Sequence[float], *,
               within: bool = False) -> str:
    """Whether proposed / control lies beyond the noise: inside one session (``within``)
    the repetitions' Welch interval and a minimum effect
    (:func:`pytest_afd.stats.session_noise.within_session_beyond`), else the between-session
    rule (:func:`pytest_afd.stats.session_noise.beyond`: apart ranges and the conservative floor)."""
    return BEYOND_NOISE if session_noise.beyond_noise(control, proposed, within=within) \
        else INSIDE_NOISE


def _condition(doc: Mapping[str, Any]) -> str:
    """The case id without its policy segment: the condition both policies ran."""
    case_id = doc["case_id"]
    policy = doc["settings"]["split_policy"]
    return case_id.removesuffix(f"/{policy}")


def policy_ratios(docs: Sequence[Mapping[str, Any]]) -> list[tuple[str, float, str]]:
    """(condition, proposed / control median throughput, noise mark) per shared condition."""
    sides: dict[str, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for doc in docs:
        policy = doc["settings"]["split_policy"]
        if policy in (CONTROL_POLICY, PROPOSED_POLICY) and _measured(doc):
            sides[_condition(doc)][policy] = doc
    rows = []
    for condition, found in sorted(sides.items()):
        if len(found) == 2:  # noqa: PLR2004 - both policies
            control, proposed = _measured(found[CONTROL_POLICY]), _measured(found[PROPOSED_POLICY])
            within = session_noise.same_session(found[CONTROL_POLICY], found[PROPOSED_POLICY])
            rows.append((condition, _median(proposed) / _median(control),
                         noise_mark(control, proposed, within=within)))
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


def ranking_text(ranking: Mapping[str, Any], docs: Sequence[Mapping[str, Any]] = ()) -> str:
    """``no significant difference: leader token_balanced 1.02 (interval 0.97–1.08), ...``;
    led by "provisional: ..." when ``docs`` (the ranked cases) ran on an oversubscribed host."""
    scores = ", ".join(f"{p} {s:.3g}" for p, s in sorted(ranking["scores"].items(),
                                                          key=lambda item: -item[1]))
    text = f"{ranking['verdict']}: leader {ranking['leader']}"
    versus = ranking.get("leader_vs_runner_up")
    if versus:
        low, high = versus["interval"]
        text += (f" over {ranking['runner_up']} x{versus['ratio']:.3g} "
                 f"({versus['confidence']:.0%} interval {low:.3g}–{high:.3g})")
    text = f"{text}; scores (throughput / baseline, geometric mean): {scores}"
    provisional = session_noise.oversubscribed_reason(docs)
    return text if provisional is None else f"{provisional}; {text}"


def outcome_counts(docs: Iterable[Mapping[str, Any]]) -> str:
    counts = Counter((doc.get("outcome") or {}).get("status", UNKNOWN) for doc in docs)
    order = [*STATUS_ORDER, UNKNOWN]
    return ", ".join(f"{counts[s]} {s}" for s in order if counts[s])


def stage_conclusion(docs: Sequence[Mapping[str, Any]]) -> str:
    """One line: provisional first when the host was oversubscribed, outcomes, the host,
    the fastest variant per condition (references included) against the between-session
    noise, the proposed / control ratios, and choices the stage recorded."""
    parts = [f"{len(docs)} case(s): {outcome_counts(docs)}"]
    provisional = session_noise.oversubscribed_reason(docs)
    if provisional:
        parts.insert(0, provisional)
    if any(_measured(doc) or doc.get("host") for doc in docs):
        parts.append(session_noise.host_line(docs))
    fastest = conclusions.fastest_text(conclusions.fastest_rows(docs))
    if fastest:
        parts.append(fastest)
    ab = conclusions.ab_text(docs)
    if ab:
        parts.append(ab)
    ratios = policy_ratios(docs)
    if ratios:
        beyond = [r for _, r, mark in ratios if mark == BEYOND_NOISE]
        geomean = math.exp(sum(math.log(r) for _, r, _ in ratios) / len(ratios))
        parts.append(
            f"{PROPOSED_POLICY} / {CONTROL_POLICY} geometric mean {geomean:.3g} over "
            f"{len(ratios)} condition(s), {len(beyond)} beyond the noise "
            f"({sum(r > 1 for r in beyond)} faster, {sum(r < 1 for r in beyond)} slower)"
        )
    best = {(tuple(doc["evidence"][STAGE_D_BEST_KEY]),
             doc["evidence"].get(STAGE_D_BEST_SOURCE_KEY, SWEEP_SOURCE)) for doc in docs
            if isinstance(doc["evidence"].get(STAGE_D_BEST_KEY), list)}
    for sizes, source in sorted(best):
        whose = ("the fastest chunked sizes of the sweep" if source == SWEEP_SOURCE
                 else f"frozen in {source}")
        parts.append("follow-ups ran chunk sizes " + ", ".join(map(str, sizes))
                     + f" ({whose}; not a verdict)")
    return "; ".join(parts)


def by_stage(docs: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    stages: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for doc in docs:
        stages[doc["case_kind"]].append(doc)
    return dict(stages)


def summary_lines(docs: Sequence[Mapping[str, Any]], stage_order: Sequence[str]) -> list[str]:
    """Plain-text verdict lines (the terminal summary): Stage A first, then each stage."""
    stages = by_stage(docs)
    lines = [f"Stage A ({test}): {ranking_text(ranking, stages.get(STAGE_A_KEY, []))}"
             for test, ranking in stage_a_rankings(docs)]
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
