"""Stage-wide A/B calls and A/A calibrations built from runs a user already has.

On a busy host three repetitions cannot resolve a 30 % change in one case: the
same case moves by up to x2 between sessions. A change of the code moves every
case of a stage, though, while session noise moves them every which way, so
``compare`` also calls each stage as a whole: the geometric mean of its cases'
B / A with a bootstrap interval over the cases, against the stage's A/A
deviation (calibrated) or :data:`~pytest_afd.stats.session_noise.UNCALIBRATED_STAGE_FLOOR`,
with CPU time moving the same way for wall-time metrics.

``compare --calibrate RUN RUN [RUN...]`` treats every session of every RUN
directory as one run of the same code, compares every pair, and stores per case
and per stage the widest deviation seen (:func:`calibrate_runs`).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pytest_afd.report.compare import (
    BOOTSTRAP_SAMPLES,
    BOOTSTRAP_SEED,
    CONFIDENCE,
    CPU_DISAGREES,
    CPU_METRIC,
    METRICS,
    NO_DIFFERENCE,
    CaseComparison,
    compare_results,
)
from pytest_afd.report.loading import LoadedResult, load_results, session_label
from pytest_afd.report.noise import (
    INCONCLUSIVE_HOST,
    Calibration,
    calibration_doc,
    host_conditions,
    host_text,
    write_calibration,
)
from pytest_afd.stats import session_noise

MIN_STAGE_CASES = 2
STAGE_HEADER = ("stage", "metric", "cases", "geometric mean B / A",
                f"{CONFIDENCE:.0%} interval (over cases)", "floor", "call")


@dataclass(frozen=True)
class StageCall:
    stage: str
    metric: str
    cases: int
    geomean: float | None
    interval: tuple[float, float] | None
    floor: float
    floor_source: str
    call: str

    def cells(self) -> list[str]:
        interval = "—" if self.interval is None else f"{self.interval[0]:.3g}–{self.interval[1]:.3g}"
        return [self.stage, self.metric, str(self.cases),
                "—" if self.geomean is None else f"{self.geomean:.3g}", interval,
                f"±{self.floor:.0%} ({self.floor_source})", self.call]


def geomean_interval(ratios: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """Geometric mean of ``ratios`` and its percentile-bootstrap interval over the cases."""
    logs = np.log(np.asarray(ratios, dtype=float))
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = logs[rng.integers(0, logs.size, (BOOTSTRAP_SAMPLES, logs.size))].mean(axis=1)
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(math.exp(logs.mean())), (float(math.exp(low)), float(math.exp(high)))


def _comparable_ratios(members: Sequence[CaseComparison], metric: str) -> list[float]:
    """B / A of the cases whose call for ``metric`` was not made inconclusive by the host."""
    ratios = []
    for comparison in members:
        row = next(r for r in comparison.rows if r[0] == metric)
        if metric in comparison.ratios and not row[5].startswith(INCONCLUSIVE_HOST):
            ratios.append(comparison.ratios[metric])
    return ratios


# How a wall-time metric scales with the CPU share a run got: tokens/s with it, TTFT against.
SHARE_EXPONENT = {METRICS[0].name: 1, METRICS[1].name: -1}


def pooled_share_ratio(members: Sequence[CaseComparison]) -> float | None:
    """B / A of the median CPU share over all the stage's repetitions (None unless every
    case recorded them): the contention difference a stage-wide wall-time mean removes."""
    pooled: list[list[float]] = [[], []]
    for comparison in members:
        for index, side in enumerate((comparison.a, comparison.b)):
            host = host_conditions(side.doc)
            if host is None or not host.shares:
                return None
            pooled[index].extend(host.shares)
    a_share, b_share = (session_noise.median(shares) for shares in pooled)
    return b_share / a_share if a_share > 0 else None


def stage_calls(comparisons: Sequence[CaseComparison], calibration: Calibration | None = None
                ) -> list[StageCall]:
    """One call per stage and metric over the stage's shared cases."""
    by_stage: dict[str, list[CaseComparison]] = defaultdict(list)
    for comparison in comparisons:
        by_stage[comparison.stage].append(comparison)
    calls = []
    for stage, members in sorted(by_stage.items()):
        cpu = _comparable_ratios(members, CPU_METRIC.name)
        cpu_mean, cpu_interval = geomean_interval(cpu) if len(cpu) >= MIN_STAGE_CASES else (
            None, None)
        for metric in METRICS:
            ratios = _comparable_ratios(members, metric.name)
            stored = None if calibration is None else calibration.stage_floor(stage, metric.name)
            floor, source = ((stored, f"A/A {calibration.name!r}") if stored is not None
                             else (session_noise.UNCALIBRATED_STAGE_FLOOR, "uncalibrated rule"))
            share = pooled_share_ratio(members) if metric.name in SHARE_EXPONENT else None
            if share is not None:  # per unit of CPU share: what contention moved is taken out
                ratios = [r / share ** SHARE_EXPONENT[metric.name] for r in ratios]
                source += f"; per CPU share, B / A share x{share:.3g}"
            if len(ratios) < MIN_STAGE_CASES:
                calls.append(StageCall(stage, metric.name, len(ratios), None, None, floor, source,
                                       f"{NO_DIFFERENCE} (fewer than {MIN_STAGE_CASES} cases)"))
                continue
            mean, interval = geomean_interval(ratios)
            call = NO_DIFFERENCE
            if not interval[0] <= 1 <= interval[1] and session_noise.outside(mean, floor):
                worse = (mean > 1) != metric.higher_is_better
                call = "B worse" if worse else "B better"
                if not metric.host_robust and cpu_interval is not None:
                    cpu_worse = cpu_interval[0] > 1
                    cpu_better = cpu_interval[1] < 1
                    if not (cpu_worse if worse else cpu_better):
                        call = f"{NO_DIFFERENCE} ({CPU_DISAGREES}: x{cpu_mean:.3g})"
            calls.append(StageCall(stage, metric.name, len(ratios), mean, interval, floor,
                                   source, call))
    return calls


# --- A/A calibration from existing runs -----------------------------------------------------
def factor_deviation(ratio: float) -> float:
    """How far ``ratio`` is from 1 as a factor either way: 0.12 for x1.12 and for x1/1.12."""
    return math.expm1(abs(math.log(ratio)))


def runs_of(directories: Sequence[Path]) -> list[tuple[str, dict[str, LoadedResult]]]:
    """Every session of every directory as one run: (name, case id -> newest result)."""
    runs = []
    for directory in directories:
        if not directory.is_dir():
            raise FileNotFoundError(f"--calibrate: results directory {str(directory)!r} "
                                    "does not exist")
        sessions: dict[str, dict[str, LoadedResult]] = defaultdict(dict)
        loaded = load_results(directory, latest_only=False).results
        for result in sorted(loaded, key=lambda r: r.doc["created_at"]):
            sessions[session_label(result.session)][result.case_id] = result
        runs += [(f"{directory} session {name}", cases) for name, cases in sorted(sessions.items())]
    return runs


def calibrate_runs(directories: Sequence[Path], path: Path) -> tuple[dict[str, Any], list[str]]:
    """Store the A/A calibration of every pair of runs at ``path``; (doc, text lines)."""
    runs = runs_of(directories)
    if len(runs) < 2:  # noqa: PLR2004 - a pair is the least an A/A needs
        raise ValueError(f"--calibrate needs at least two runs (sessions) of the same code; "
                         f"found {len(runs)} in {', '.join(map(str, directories))}")
    cases: dict[str, dict[str, float]] = defaultdict(dict)
    stages: dict[str, dict[str, float]] = defaultdict(dict)
    hosts: dict[str, list[str]] = defaultdict(list)
    pairs = 0
    for (_, a), (_, b) in itertools.combinations(runs, 2):
        comparisons = compare_results(a, b)
        pairs += bool(comparisons)
        for comparison in comparisons:
            for metric, ratio in comparison.ratios.items():
                widest = cases[comparison.case_id].get(metric, 0.0)
                cases[comparison.case_id][metric] = max(widest, factor_deviation(ratio))
            for side in (comparison.a, comparison.b):
                text = host_text(host_conditions(side.doc))
                if text not in hosts[comparison.case_id]:
                    hosts[comparison.case_id].append(text)
        for call in stage_calls(comparisons):
            if call.geomean is not None:
                widest = stages[call.stage].get(call.metric, 0.0)
                stages[call.stage][call.metric] = max(widest, factor_deviation(call.geomean))
    if not pairs:
        raise ValueError("--calibrate: no two runs share a case id; nothing to calibrate")
    doc = calibration_doc(path.stem, [name for name, _ in runs], cases, hosts, stages)
    write_calibration(path, doc)
    lines = [f"A/A calibration of {len(runs)} runs ({pairs} pairs sharing cases) stored in {path}",
             "widest stage-wide deviation per metric (what a stage-wide change must beat):"]
    lines += [f"  {stage} {metric}: {value:.1%}" for stage, metrics in sorted(stages.items())
              for metric, value in metrics.items()]
    return doc, lines


def terminal_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Plain aligned columns for the terminal."""
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
    return [line(header), *(line(row) for row in rows)]


def case_calls(comparisons: Sequence[CaseComparison]) -> Mapping[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for comparison in comparisons:
        for row in comparison.rows:
            counts[row[5].partition(" (")[0]] += 1
    return counts


# --- the first line of compare's answer -------------------------------------------------------
CALLED = ("B better", "B worse")
# The flags are pytest_afd.run.ab's and ab_sides' (a layer above: tests check they agree).
INTERLEAVED_HINT = ("measure A and B interleaved in one session instead: pytest -m <stage> "
                    "with --afd-ab A B (two option sets), --afd-ab-checkout DIR_A DIR_B or "
                    "--afd-ab-python PY_A PY_B (two code versions) or --afd-ab-url URL_A URL_B "
                    "(two deployments) (docs/report.md, \"Interleaved A/B\")")


def excluded_cases(comparisons: Sequence[CaseComparison]) -> dict[str, int]:
    """Why shared cases left the wall-time calls: reason -> how many cases (a case counts
    once, under its first wall-time metric's reason)."""
    reasons: dict[str, int] = defaultdict(int)
    for comparison in comparisons:
        call = comparison.rows[0][5]
        if call.startswith(INCONCLUSIVE_HOST):
            reasons[call.removeprefix("inconclusive: ")] += 1
        elif call.startswith("not measured"):
            reasons["not measured on both sides"] += 1
    return dict(reasons)


def verdict_line(comparisons: Sequence[CaseComparison], calls: Sequence[StageCall]) -> str:
    """compare's first line: the stage-wide calls made, else whether it could decide at all
    (how many cases were excluded and why, and the interleaved method that decides)."""
    if not comparisons:
        return f"verdict: cannot decide: A and B share no case; {INTERLEAVED_HINT}"
    made = [c for c in calls if c.call in CALLED]
    reasons = excluded_cases(comparisons)
    excluded = sum(reasons.values())
    why = "; ".join(f"{n} {reason}" for reason, n in sorted(reasons.items(), key=lambda i: -i[1]))
    if made:
        text = "verdict: " + "; ".join(f"{c.stage} {c.metric}: {c.call} x{c.geomean:.3g}"
                                       for c in made)
        return text + (f" ({excluded} of {len(comparisons)} case(s) excluded: {why})"
                       if excluded else "")
    starved = [c for c in calls if c.cases < MIN_STAGE_CASES]
    if excluded and starved:
        return (f"verdict: cannot decide: {excluded} of {len(comparisons)} shared case(s) "
                f"excluded ({why}), leaving fewer than {MIN_STAGE_CASES} comparable cases in "
                f"{len({c.stage for c in starved})} stage(s); {INTERLEAVED_HINT}")
    tail = f" ({excluded} of {len(comparisons)} case(s) excluded: {why})" if excluded else ""
    return (f"verdict: no significant difference in any stage over {len(comparisons)} shared "
            f"case(s){tail}")
