"""Which variant was fastest in each condition, references included, and whether that holds.

A stage's cases are grouped by condition: the case id without its last segment
(the policy, the chunk size, the routing; Stage F: without ``afd/<layout>`` or
``pp/<layout>``). Within a condition every measured variant competes, the
references too (``none``: no split; ``unchunked``), on the median prefill
throughput the stage's table and plots show. The fastest is a *winner* only
when its lead over the runner-up lies beyond the noise: inside one session
the repetitions' Welch interval and a minimum effect
(:func:`pytest_afd.stats.session_noise.within_session_beyond`), across sessions the
between-session rule (:func:`pytest_afd.stats.session_noise.beyond`); otherwise the
row says "inside the noise". The report's "Fastest per condition" table and the stage's one-line
conclusion are both made from :func:`fastest_rows`, so they cannot disagree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_afd.stats import session_noise

# Variants that are a stage's reference rather than a candidate.
REFERENCES = ("none", "unchunked")
PAIR_ROLES = ("afd", "pp")
NODE_SEPARATOR = "::"
HEADER = ("condition", "fastest", "tokens/s", "runner-up", "tokens/s ", "fastest / runner-up",
          "call")
WINNER = "winner (beyond the noise)"
INSIDE = "inside the noise"
ALONE = "only variant measured"


@dataclass(frozen=True)
class FastestRow:
    condition: str
    fastest: str
    fastest_median: float
    runner_up: str | None
    runner_up_median: float | None
    winner: bool

    @property
    def ratio(self) -> float | None:
        if not self.runner_up_median:
            return None
        return self.fastest_median / self.runner_up_median

    @property
    def call(self) -> str:
        if self.runner_up is None:
            return ALONE
        return WINNER if self.winner else INSIDE

    @property
    def reference_fastest(self) -> bool:
        return self.fastest in REFERENCES and self.runner_up is not None

    def cells(self) -> list[str]:
        ratio = self.ratio
        return [
            self.condition,
            self.fastest,
            f"{self.fastest_median:,.0f}",
            self.runner_up or "—",
            "—" if self.runner_up_median is None else f"{self.runner_up_median:,.0f}",
            "—" if ratio is None else f"x{ratio:.3g}",
            self.call,
        ]


def condition_and_variant(case_id: str) -> tuple[str, str]:
    """("sweep/bimodal-fixed", "chunk1024") from ``path::test/sweep/bimodal-fixed/chunk1024``."""
    tail = case_id.rpartition(NODE_SEPARATOR)[2]
    segments = tail.split("/")
    if len(segments) < 2:  # noqa: PLR2004 - one case per test: nothing to compete with
        return tail, tail
    cut = 2 if len(segments) > 2 and segments[-2] in PAIR_ROLES else 1  # noqa: PLR2004
    variant = segments[-cut]
    test, *middle = segments[:-cut]
    params = test[test.index("["):] if "[" in test else ""
    return f"{params} {'/'.join(middle)}".strip() or test, variant


def _repetitions(doc: Mapping[str, Any]) -> list[float]:
    value = doc["metrics"]["prefill_tokens_per_s"]
    if not isinstance(value, Mapping) or "repetitions" not in value:
        return []
    return [float(v) for v in value["repetitions"]]


def fastest_rows(docs: Sequence[Mapping[str, Any]]) -> list[FastestRow]:
    """One row per condition with at least one measured variant, in condition order."""
    groups: dict[str, dict[str, list[float]]] = defaultdict(dict)
    written: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for doc in docs:
        repetitions = _repetitions(doc)
        if repetitions:
            condition, variant = condition_and_variant(doc["case_id"])
            groups[condition][variant] = repetitions
            written[condition].append(doc)
    rows = []
    for condition, variants in sorted(groups.items()):
        within = session_noise.same_session(*written[condition])
        ranked = sorted(variants, key=lambda v: (-session_noise.median(variants[v]), v))
        leader = ranked[0]
        runner = ranked[1] if len(ranked) > 1 else None
        rows.append(FastestRow(
            condition=condition,
            fastest=leader,
            fastest_median=session_noise.median(variants[leader]),
            runner_up=runner,
            runner_up_median=None if runner is None else session_noise.median(variants[runner]),
            winner=runner is not None and session_noise.beyond_noise(
                variants[runner], variants[leader], within=within),
        ))  # fmt: skip
    return rows


def fastest_text(rows: Sequence[FastestRow]) -> str:
    """The conclusion's clause: the references' wins first, then winners beyond the noise."""
    compared = [row for row in rows if row.runner_up is not None]
    if not compared:
        return ""
    parts = []
    by_reference = [row for row in compared if row.reference_fastest]
    if by_reference:
        named = ", ".join(f"{row.condition} ({row.fastest} x{row.ratio:.3g} over "
                          f"{row.runner_up}, {'beyond' if row.winner else 'inside'} the noise)"
                          for row in by_reference)
        parts.append(f"the reference was fastest in {len(by_reference)} of {len(compared)} "
                     f"condition(s): {named}")
    winners = [row for row in compared if row.winner]
    if winners:
        named = ", ".join(f"{row.condition}: {row.fastest} x{row.ratio:.3g} over {row.runner_up}"
                          for row in winners)
        parts.append(f"a winner beyond the noise in {len(winners)} of "
                     f"{len(compared)}: {named}")
    else:
        parts.append(f"no winner beyond the noise in any of {len(compared)} "
                     "condition(s)")
    return "; ".join(parts)


def fastest_table(docs: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the report's "Fastest per condition" table."""
    return list(HEADER), [row.cells() for row in fastest_rows(docs)]


# --- interleaved A/B (--afd-ab) ---------------------------------------------------------------
AB_SIDES = ("ab-A", "ab-B")
AB_RESAMPLES = 2000
AB_CONFIDENCE = 0.95


def ab_ratios(docs: Sequence[Mapping[str, Any]]) -> list[float]:
    """Per case measured with both option sets (``<case>/ab-A``, ``<case>/ab-B``): B / A of
    the median throughput."""
    sides: dict[str, dict[str, list[float]]] = defaultdict(dict)
    for doc in docs:
        parent, _, side = doc["case_id"].rpartition("/")
        if side in AB_SIDES and _repetitions(doc):
            sides[parent][side] = _repetitions(doc)
    return [session_noise.median(found["ab-B"]) / session_noise.median(found["ab-A"])
            for _, found in sorted(sides.items()) if len(found) == len(AB_SIDES)]


def ab_text(docs: Sequence[Mapping[str, Any]]) -> str:
    """``interleaved A/B: B / A geometric mean x0.97 over 17 case(s) (95% interval over
    cases 0.93–1.01): no difference``; empty without A/B results.

    A and B ran alternately in one session, so the session's noise hits both:
    the call needs only the interval over the cases to exclude 1.
    """
    import numpy as np  # the report's numeric stack; verdicts without A/B never load it

    ratios = ab_ratios(docs)
    if not ratios:
        return ""
    logs = np.log(np.asarray(ratios))
    rng = np.random.default_rng(0)
    means = logs[rng.integers(0, logs.size, (AB_RESAMPLES, logs.size))].mean(axis=1)
    tail = (1 - AB_CONFIDENCE) / 2 * 100
    low, high = np.exp(np.percentile(means, [tail, 100 - tail]))
    mean = float(np.exp(logs.mean()))
    call = ("B faster" if low > 1 else "B slower" if high < 1 else "no difference")
    return (f"interleaved A/B: B / A geometric mean x{mean:.3g} over {len(ratios)} case(s) "
            f"({AB_CONFIDENCE:.0%} interval over cases {low:.3g}–{high:.3g}): {call}")
