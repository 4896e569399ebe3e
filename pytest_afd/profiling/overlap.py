"""Interval arithmetic over profiled work: busy unions, cross-role overlap, idle time.

The communication/compute split of a step reuses msprof-analyze's
``RangeCaculator`` (the one its step trace uses). What msprof-analyze has no
notion of is overlap *between* the AFD roles: the share of the lighter role's
busy time during which the other role was busy too. It is defined once, here,
and the CPU AFD runtime's own timeline evidence (``backends/cpu/afd/evidence``)
calls the same functions, so the runtime and profiles of either backend agree
by construction; unions and overlap need no optional package.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Interval = tuple[float, float]  # profiles: integer ns (profiling.timebase); the CPU runtime: s


def _calculator():
    from msprof_analyze.cluster_analyse.common_func.time_range_calculator import (
        RangeCaculator,
        TimeRange,
    )

    return RangeCaculator, TimeRange


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of ``intervals`` as sorted disjoint intervals (touching ones joined)."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def union_length(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in merge(intervals))


def intersection_length(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    first, second = merge(a), merge(b)
    total, i, j = 0.0, 0, 0
    while i < len(first) and j < len(second):
        low, high = max(first[i][0], second[j][0]), min(first[i][1], second[j][1])
        total += max(0.0, high - low)
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_fraction(attention: Sequence[Interval], ffn: Sequence[Interval]) -> float | None:
    """Share of the lighter role's busy time overlapped by the other's; None when one is idle."""
    smaller = min(union_length(attention), union_length(ffn))
    if smaller <= 0:
        return None
    return intersection_length(attention, ffn) / smaller


def step_trace(busy: Sequence[Interval], communication: Sequence[Interval],
               window: Interval, blocked: Sequence[Interval] = ()) -> dict[str, float]:
    """Computing / Communication(Not Overlapped) / Overlapped / Free of one rank's step.

    The msprof-analyze definitions (its ``RangeCaculator.compute_pipeline_overlap``),
    for traces torch_npu did not already reduce (CPU ``torch.profiler`` traces).
    ``blocked`` (waiting on the peer) is neither computing nor free: the caller
    counts it as bubble. Intervals in integer ns give the figures in integer ns.
    """
    calculator, time_range = _calculator()
    from msprof_analyze.cluster_analyse.common_func.time_range_calculator import (
        CommunicationTimeRange,
    )

    compute = calculator.merge_continuous_intervals(
        [calculator.generate_time_range(s, e, time_range) for s, e in busy])
    comm = calculator.merge_continuous_intervals(
        [calculator.generate_time_range(s, e, CommunicationTimeRange) for s, e in communication])
    pure, _free = calculator.compute_pipeline_overlap(comm, compute)
    computing = sum(r.end_ts - r.start_ts for r in compute)
    communication_s = sum(r.end_ts - r.start_ts for r in comm)
    not_overlapped = sum(r.end_ts - r.start_ts for r in pure)
    covered = union_length([(r.start_ts, r.end_ts) for r in compute + comm] + list(blocked))
    free = max(0, (window[1] - window[0]) - covered)
    return {
        "computing_ns": computing,
        "communication_not_overlapped_ns": not_overlapped,
        "overlapped_ns": communication_s - not_overlapped,
        "communication_ns": communication_s,
        "free_ns": free,
        "stage_ns": computing + not_overlapped + free,
        "bubble_ns": 0,
    }
