"""Kernel rows of one ``*_ascend_pt`` rank, each placed in the AFD range that launched it.

Rows come from ``kernel_details.csv`` through msprof-analyze's own reader and
bean (``KernelDetailsBean``: ``Type``, ``Name``, ``Start Time(us)``,
``Duration(us)``, ``Step Id``); ranges and launch flows from ``trace_view.json``
through its ``TraceEventBean``. A device kernel runs after its host launch, so
its range is the host range containing its *launch*: the flow event pair
(``ph`` ``s`` on the host at the launch, ``f`` on the device at the kernel's
start, one ``id``) links the two. A kernel without a flow falls back to the
range containing its own start (device-side mstx ranges, CPU traces).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from afd_split.ranges import RangeTag, parse_range
from pytest_afd.profiling.msprof import file_manager
from pytest_afd.profiling.timebase import NS_PER_S, us_to_ns

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
KERNEL_DETAILS = "kernel_details.csv"
TRACE_VIEW = "trace_view.json"
PROFILER_INFO_PREFIX = "profiler_info_"
# kernel_details.csv without a "Step Id" column (no profiler schedule): msprof-analyze's
# KernelDetailsBean gives -1; the step trace's Step is then empty too.
VOID_STEP = -1
NO_STEP = ""


@dataclass(frozen=True)
class Interval:
    tag: RangeTag
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Kernel:
    step: str
    name: str
    op_type: str
    start_ns: int
    duration_ns: int
    tag: RangeTag | None  # the AFD range it was launched in; None outside every range

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


def rank_id(rank_dir: Path) -> int:
    """The rank from ``profiler_info_<rank>.json`` (as msprof-analyze reads it)."""
    for path in Path(rank_dir).iterdir():
        stem = path.name
        if stem.startswith(PROFILER_INFO_PREFIX) and stem.endswith(".json"):
            return int(stem[len(PROFILER_INFO_PREFIX):-len(".json")])
    raise ValueError(f"{str(rank_dir)!r}: no profiler_info_<rank>.json (not a torch_npu rank dir)")


def rank_dirs(collection: Path) -> list[Path]:
    """Every ``*_ascend_pt`` directory under ``collection`` (itself included), sorted by rank."""
    collection = Path(collection)
    found = [collection] if collection.name.endswith("_ascend_pt") else []
    found += [p for p in collection.rglob("*_ascend_pt") if p.is_dir()]
    return sorted(found, key=rank_id)


def read_ranges_and_flows(trace_view: Path) -> tuple[list[Interval], dict[int, int]]:
    """AFD ranges, and device-start -> host-launch time for every launch flow."""
    from msprof_analyze.compare_tools.compare_backend.compare_bean.origin_data_bean.trace_event_bean import (
        TraceEventBean,
    )

    events = file_manager().read_json_file(str(trace_view))
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    ranges: list[Interval] = []
    starts: dict[object, int] = {}
    ends: dict[object, int] = {}
    where = str(trace_view)
    for raw in events:
        event = TraceEventBean(raw)
        # The raw "ts" text, not the bean's float (a float of us loses the ns digits).
        if event.is_x_mode():
            tag = parse_range(event.name)
            if tag is not None:
                start = us_to_ns(raw.get("ts"), f"{where}: ts of {event.name!r}")
                ranges.append(Interval(tag, start, start + us_to_ns(
                    raw.get("dur", 0), f"{where}: dur of {event.name!r}")))
        elif event.is_flow_start():
            starts[raw.get("id")] = us_to_ns(raw.get("ts"), f"{where}: flow ts")
        elif event.is_flow_end():
            ends[raw.get("id")] = us_to_ns(raw.get("ts"), f"{where}: flow ts")
    launches = {ends[key]: starts[key] for key in ends if key in starts}
    return sorted(ranges, key=lambda r: r.start_ns), launches


def innermost(ranges: list[Interval], starts: list[int], time_ns: int) -> RangeTag | None:
    """The tag of the latest-starting range that contains ``time_ns`` (ranges nest)."""
    index = bisect.bisect_right(starts, time_ns) - 1
    while index >= 0:
        candidate = ranges[index]
        if candidate.start_ns <= time_ns < candidate.end_ns:
            return candidate.tag
        index -= 1
    return None


def read_kernels(rank_dir: Path) -> list[Kernel]:
    """Every kernel of one rank, placed in its launching range."""
    from msprof_analyze.compare_tools.compare_backend.compare_bean.origin_data_bean.kernel_details_bean import (
        KernelDetailsBean,
    )

    output = Path(rank_dir) / OUTPUT_DIR
    details = output / KERNEL_DETAILS
    if not details.is_file():
        raise ValueError(f"{str(rank_dir)!r}: no {OUTPUT_DIR}/{KERNEL_DETAILS}")
    rows = file_manager().read_csv_file(str(details), KernelDetailsBean)
    trace_view = output / TRACE_VIEW
    ranges, launches = read_ranges_and_flows(trace_view) if trace_view.is_file() else ([], {})
    starts = [r.start_ns for r in ranges]
    kernels = []
    for number, row in enumerate(rows, start=2):
        where = f"{str(details)!r} line {number}"
        # The bean's raw text (its float properties would round the ns digits away).
        start = us_to_ns(row._start_time, f"{where}: Start Time(us)")
        duration = us_to_ns(row._duration, f"{where}: Duration(us)")
        placed_at = launches.get(start, start)
        step = NO_STEP if row.step_id == VOID_STEP else str(row.step_id)
        kernels.append(Kernel(step, row.name, row.op_type, start, duration,
                              innermost(ranges, starts, placed_at)))
    return kernels


def seconds(kernels: Iterable[Kernel]) -> float:
    return sum(k.duration_ns for k in kernels) / NS_PER_S
