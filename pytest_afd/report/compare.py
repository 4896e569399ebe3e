"""A/B comparison of two result selections: every shared case side by side.

A side is a results directory, optionally narrowed to one session or one stack
(manifest digest prefix). By default each side is its latest session. Cases
are matched by case id. Per case and metric: both medians with their
dispersion, the ratio B / A, a bootstrap interval of that ratio over the
repetitions, the noise floor, both hosts' conditions and a call (CPU time is
compared beside the wall-time metrics). The call names a change only when the
interval excludes 1, the min-max ranges do not overlap and B / A is further
from 1 than the noise floor (pytest_afd.report.noise: the repetitions' spread
and, when named, a stored A/A calibration). Wall-time metrics of cases whose
recorded host conditions differ are "inconclusive: host conditions differ
(load a → b)".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_afd.report.compare_notes import notes
from pytest_afd.report.loading import LoadedResult
from pytest_afd.report.noise import (
    CPU_CONTENTION_FLOOR,
    INCONCLUSIVE_HOST,
    Calibration,
    HostConditions,
    host_conditions,
    host_difference,
    host_text,
    oversubscribed,
    share_difference,
    shares_differ,
)
from pytest_afd.report.tables import EMPTY, fmt, fmt_measure
from pytest_afd.report.values import (
    condition_labels,
    repetitions_of,
    throughput,
    ttft_of,
)
from pytest_afd.stats import session_noise

COMPARE_FILE_NAME = "compare.md"
COMPARE_HTML_NAME = "compare.html"
DEFAULT_COMPARE_DIR = "afd-compare"
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95
NO_DIFFERENCE = "no significant difference"
NOT_MEASURED = "not measured"
OTHER_KINDS = ("gate", "benchmark", "other")
CPU_TIME_METRIC = "cpu_time_s"


@dataclass(frozen=True)
class Metric:
    name: str
    read: Callable[[Mapping[str, Any]], Any]
    higher_is_better: bool
    # CPU time is compared even when the hosts differ (a loaded host stretches it far less).
    host_robust: bool = False


CPU_METRIC = Metric("CPU time (s)", lambda doc: doc["metrics"].get(CPU_TIME_METRIC), False, True)
METRICS = (
    Metric("prefill tokens/s", throughput, True),
    Metric("TTFT p50 (s)", lambda doc: ttft_of(doc, "p50"), False),
    CPU_METRIC,
)
CPU_DISAGREES = "CPU time does not agree"
HEADER = (
    "case",
    "condition",
    "metric",
    "A",
    "B",
    "B / A",
    f"{CONFIDENCE:.0%} interval",
    "call",
    "noise floor",
    "host A → B",
    "notes",
)


def bootstrap_ratio_interval(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """Percentile interval of median(B) / median(A) over resampled repetitions."""
    if not a or not b or min(a) <= 0:
        return None
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    a_values, b_values = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    a_medians = np.median(rng.choice(a_values, (BOOTSTRAP_SAMPLES, a_values.size)), axis=1)
    b_medians = np.median(rng.choice(b_values, (BOOTSTRAP_SAMPLES, b_values.size)), axis=1)
    ratios = b_medians / a_medians
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(low), float(high)


def _cv(values: Sequence[float]) -> float:
    mean = float(np.mean(values))
    return float(np.std(values, ddof=1)) / abs(mean) if len(values) > 1 and mean else 0.0


def significance_call(
    a: Sequence[float],
    b: Sequence[float],
    higher_is_better: bool,
    *,
    floor: float | None = None,
    host_change: str | None = None,
    host_robust: bool = False,
    cpu_agrees: bool | None = None,
) -> tuple[float | None, tuple[float, float] | None, str]:
    """(ratio of medians, interval, call) for one metric of one case.

    A change needs all of: the bootstrap interval excludes 1, the min-max
    ranges do not overlap, the ratio is further from 1 than the between-session
    noise (``floor`` from an A/A calibration, else the conservative
    :func:`~pytest_afd.stats.session_noise.uncalibrated_floor`), and, for a wall-time
    metric whose CPU time was recorded, CPU time moved the same way
    (``cpu_agrees``). ``host_change`` names a host difference: a wall-time
    metric is then inconclusive; a ``host_robust`` one (CPU time) must beat
    :data:`CPU_CONTENTION_FLOOR` as well.
    """
    if not a or not b:
        return None, None, NOT_MEASURED
    ratio = float(np.median(b) / np.median(a)) if np.median(a) > 0 else None
    interval = bootstrap_ratio_interval(a, b)
    if host_change is not None and not host_robust:
        return ratio, interval, f"{INCONCLUSIVE_HOST} ({host_change})"
    limit = session_noise.uncalibrated_floor(a, b) if floor is None else max(floor, _cv(a), _cv(b))
    if host_change is not None:
        limit = max(limit, CPU_CONTENTION_FLOOR)
    ranges_apart = max(a) < min(b) or max(b) < min(a)
    if ratio is None or interval is None or not ranges_apart or interval[0] <= 1 <= interval[1]:
        return ratio, interval, NO_DIFFERENCE
    if not session_noise.outside(ratio, limit):
        return ratio, interval, NO_DIFFERENCE
    if cpu_agrees is False:
        return ratio, interval, f"{NO_DIFFERENCE} ({CPU_DISAGREES})"
    better = (ratio > 1) == higher_is_better
    return ratio, interval, "B better" if better else "B worse"


def cpu_direction(a: Sequence[float], b: Sequence[float]) -> int | None:
    """+1 when B used clearly more CPU time (ranges apart), -1 clearly less, 0 neither;
    None when either side has none recorded."""
    if not a or not b:
        return None
    if min(b) > max(a):
        return 1
    return -1 if max(b) < min(a) else 0


def agrees(metric: Metric, ratio: float | None, direction: int | None) -> bool | None:
    """Whether a wall-time metric's move is one CPU time makes too (slower = more CPU)."""
    if metric.host_robust or direction is None or ratio is None:
        return None
    worse = (ratio > 1) != metric.higher_is_better
    return direction == (1 if worse else -1)


@dataclass(frozen=True)
class CaseComparison:
    case_id: str
    stage: str
    condition: str
    a: LoadedResult
    b: LoadedResult
    # metric, A, B, ratio, interval, call, noise floor, host A -> B
    rows: tuple[tuple[str, ...], ...]
    notes: str
    # metric -> B / A: what an A/A calibration stores.
    ratios: Mapping[str, float]


def _floor_text(a: Sequence[float], b: Sequence[float], calibrated: tuple[float, str] | None,
                host_change: str | None, metric: Metric) -> str:
    if not a or not b:
        return EMPTY
    floors = [(max(_cv(a), _cv(b)), "repetitions")]
    floors.append(calibrated if calibrated is not None
                  else (session_noise.uncalibrated_floor(a, b), "uncalibrated rule"))
    if host_change is not None and metric.host_robust:
        floors.append((CPU_CONTENTION_FLOOR, "host contention"))
    value, source = max(floors, key=lambda item: item[0])
    return f"±{value:.1%} ({source})"


def compare_case(
    a: LoadedResult, b: LoadedResult, condition: str, calibration: Calibration | None = None,
    *, same_contention: bool = False,
) -> CaseComparison:
    """One case's rows. ``same_contention``: the stage's pooled CPU shares matched
    (:func:`stage_contention`), so a case whose three shares happen to drift apart is
    not excluded for it."""
    hosts = host_conditions(a.doc), host_conditions(b.doc)
    host_change = host_difference(*hosts)
    change = None if same_contention and host_change is None else (
        share_difference(*hosts) or host_change)
    cpu_comparable = change is None or not oversubscribed(*hosts)
    host_cell = f"{host_text(hosts[0])} → {host_text(hosts[1])}"
    cpu = CPU_METRIC.read
    direction = cpu_direction(repetitions_of(cpu(a.doc)), repetitions_of(cpu(b.doc)))
    rows, ratios = [], {}
    for metric in METRICS:
        left, right = repetitions_of(metric.read(a.doc)), repetitions_of(metric.read(b.doc))
        calibrated = None if calibration is None else calibration.floor(a.case_id, metric.name)
        median_ratio = float(np.median(right) / np.median(left)) if left and right else None
        ratio, interval, call = significance_call(
            left, right, metric.higher_is_better,
            floor=None if calibrated is None else calibrated[0],
            host_change=change, host_robust=metric.host_robust and cpu_comparable,
            cpu_agrees=agrees(metric, median_ratio, direction),
        )  # fmt: skip
        if ratio is not None:
            ratios[metric.name] = ratio
        interval_text = EMPTY if interval is None else f"{interval[0]:.3g}–{interval[1]:.3g}"
        rows.append(
            (
                metric.name,
                fmt_measure(metric.read(a.doc)),
                fmt_measure(metric.read(b.doc)),
                fmt(ratio),
                interval_text,
                call,
                _floor_text(left, right, calibrated, change, metric),
                host_cell,
            )
        )
    return CaseComparison(
        a.case_id, a.stage, condition, a, b, tuple(rows), notes(a, b), ratios
    )


def compare_results(
    a: Mapping[str, LoadedResult],
    b: Mapping[str, LoadedResult],
    calibration: Calibration | None = None,
) -> list[CaseComparison]:
    """Shared cases in case-id order; condition labels are made per stage."""
    shared = sorted(set(a) & set(b))
    by_stage: dict[str, list[LoadedResult]] = defaultdict(list)
    for case in shared:
        by_stage[a[case].stage].append(a[case])
    labels: dict[str, str] = {}
    for members in by_stage.values():
        labels.update(condition_labels(members))
    matched = {stage: stage_contention([a[c] for c in shared if a[c].stage == stage],
                                       [b[c] for c in shared if a[c].stage == stage])
               for stage in by_stage}
    return [compare_case(a[case], b[case], labels[case], calibration,
                         same_contention=matched[a[case].stage]) for case in shared]


def stage_contention(a: Sequence[LoadedResult], b: Sequence[LoadedResult]) -> bool:
    """Whether A and B met the same contention over a stage: every case recorded CPU shares
    and the median of all A's repetitions' shares matches B's (within
    :data:`~pytest_afd.report.noise.CPU_SHARE_TOLERANCE`). Contention belongs to the
    session, so it is judged over all of a stage's repetitions, not from three of one case."""
    pooled = []
    for side in (a, b):
        hosts = [host_conditions(result.doc) for result in side]
        if not hosts or any(h is None or not h.shares for h in hosts):
            return False
        if len({h.cpu_count for h in hosts}) != 1:
            return False
        shares = tuple(share for h in hosts for share in h.shares)
        pooled.append(HostConditions(hosts[0].cpu_count, hosts[0].load, shares))
    return pooled[0].cpu_count == pooled[1].cpu_count and not shares_differ(*pooled)

