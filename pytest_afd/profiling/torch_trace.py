"""CPU ``torch.profiler`` traces of the AFD runtime -> :class:`RoleData`, then the same evidence.

Layout (``pytest_afd.backends.cpu.afd.tracing``): ``<root>/<role>/rank<i>/step<n>.pt.trace.json``.
Each ``afd|<stage>|L<layer>|U<ubatch>`` range (``user_annotation``) is one work
item: on a CPU the torch ops inside run synchronously, so the range's time is
the stage's time. Per rank and step, the msprof-analyze step-trace quantities
are computed with its own interval code (``overlap.step_trace``): message
ranges (dispatch, recv, send) are communication, ``wait`` is bubble.

Collectives: the runtime's Attention<->FFN messages are torch.distributed
point-to-point ops over gloo (``gloo:send`` / ``gloo:recv`` /
``gloo:recvAnySource`` events); each is one op
of group ``afd_connector`` (the stand-in for CAM dispatch/combine), its time the
event's duration, its volume the first input's shape x element size (traces
record shapes, as the plugin's profiler does).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from afd_split.ranges import parse_range
from pytest_afd.profiling import evidence, overlap
from pytest_afd.profiling.components import RANGE_TYPE
from pytest_afd.profiling.msprof import file_manager
from pytest_afd.profiling.timebase import us_to_ns

SOURCE = "torch_trace"
COMMUNICATION_STAGES = frozenset({"dispatch", "recv", "send"})
_RANK_DIR = re.compile(r"^rank(\d+)$")
# gloo's own send/recv events carry the tensor's type and shape (c10d's, a TensorList).
MESSAGE_OPS = frozenset({"gloo:send", "gloo:recv", "gloo:recvAnySource"})
CONNECTOR_GROUP = "afd_connector"
BYTES_PER_MB = 1e6  # msprof-analyze's Transit Size(MB): MB / ms = GB / s
# Element sizes of the "Input type" names torch.profiler writes (record_shapes).
ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2,
                 "long int": 8, "int": 4, "short int": 2, "signed char": 1,
                 "unsigned char": 1, "bool": 1}
_STEP_FILE = re.compile(r"^step(\d+)\.pt\.trace\.json$")


def analyzer() -> dict[str, str]:
    return {"name": "torch.profiler + msprof-analyze",
            "version": f"torch {importlib.metadata.version('torch')}, msprof-analyze "
                       f"{importlib.metadata.version('msprof-analyze')}"}


def read_events(path: Path) -> list[dict[str, Any]]:
    """The trace's events; a file that does not parse is named with the parser's error."""
    reader = file_manager()  # outside the try: a missing msprof-analyze says so itself
    try:
        doc = reader.read_json_file(str(path))
    except RuntimeError as error:  # msprof-analyze's wrapper of the JSON error
        raise ValueError(f"parse error in trace {str(path)!r} (truncated or corrupt?): "
                         f"{error.__cause__ or error}") from error
    return doc.get("traceEvents", []) if isinstance(doc, dict) else doc


def read_items(events: list[dict[str, Any]], step: str) -> list[evidence.WorkItem]:
    """The AFD ranges of one Chrome trace as work items (other events are not stages)."""
    items = []
    for event in events:
        tag = parse_range(str(event.get("name", ""))) if event.get("ph") == "X" else None
        if tag is None:
            continue
        items.append(evidence.WorkItem(step, event["name"], RANGE_TYPE,
                                       us_to_ns(event["ts"], f"{event['name']!r} ts"),
                                       us_to_ns(event.get("dur", 0), f"{event['name']!r} dur"),
                                       tag))
    return items


def read_messages(events: list[dict[str, Any]], step: str, rank: int,
                  where: Path) -> list[dict[str, Any]]:
    """The trace's point-to-point message ops as collective records (one op each)."""
    records = []
    for event in events:
        if event.get("ph") != "X" or event.get("name") not in MESSAGE_OPS:
            continue
        args = event.get("args", {})
        dims, types = args.get("Input Dims") or [[]], args.get("Input type") or [""]
        if types[0] not in ELEMENT_BYTES:
            raise ValueError(f"{str(where)!r}: {event['name']} has element type {types[0]!r} "
                             f"(known: {sorted(ELEMENT_BYTES)}); was it traced with shapes?")
        elements = 1
        for size in dims[0]:
            elements *= int(size)
        nanos = us_to_ns(event.get("dur", 0), f"{str(where)!r}: {event['name']} dur")
        records.append({"group": CONNECTOR_GROUP, "step": step, "rank": rank, "num_ops": 1,
                        "time_ns": nanos, "transit_time_ns": nanos,
                        "volume_mb": elements * ELEMENT_BYTES[types[0]] / BYTES_PER_MB})
    return records


def rank_step_trace(items: list[evidence.WorkItem]) -> evidence.StepTrace:
    if not items:
        return overlap.step_trace([], [], (0, 0))
    blocked = [i.interval for i in items if not i.busy]
    comm = [i.interval for i in items if i.busy and i.stage_name in COMMUNICATION_STAGES]
    busy = [i.interval for i in items if i.busy and i.stage_name not in COMMUNICATION_STAGES]
    window = (min(i.interval[0] for i in items), max(i.interval[1] for i in items))
    trace = overlap.step_trace(busy, comm, window, blocked)
    trace["bubble_ns"] = overlap.union_length(blocked)
    return trace


def load_role(role: str, role_dir: Path) -> evidence.RoleData:
    ranks, messages = [], []
    for rank_dir in sorted(Path(role_dir).iterdir()):
        match = _RANK_DIR.match(rank_dir.name)
        if not match or not rank_dir.is_dir():
            continue
        items, steps = [], {}
        for path in sorted(rank_dir.iterdir()):
            step_match = _STEP_FILE.match(path.name)
            if step_match is None:
                continue
            events = read_events(path)
            step_items = read_items(events, step_match.group(1))
            messages += read_messages(events, step_match.group(1), int(match.group(1)), path)
            items += step_items
            steps[step_match.group(1)] = rank_step_trace(step_items)
        ranks.append(evidence.RankData(int(match.group(1)), items, steps))
    if not ranks:
        raise ValueError(f"{str(role_dir)!r}: no rank<i>/step<n>.pt.trace.json traces")
    return evidence.RoleData(role, ranks, messages)


def analyse(trace_root: Path, *, expert_load_per_rank=None,
            schedule: Mapping[str, Any] | None = None,
            overhead: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``evidence.profile`` record of a CPU run's traces under ``trace_root``."""
    roles = {path.name: load_role(path.name, path) for path in sorted(Path(trace_root).iterdir())
             if path.is_dir() and path.name in (evidence.ATTENTION_ROLE, evidence.FFN_ROLE)}
    if not roles:
        raise ValueError(f"{str(trace_root)!r}: no attention/ or ffn/ trace directory")
    return evidence.build(roles, source=SOURCE, analyzer=analyzer(),
                          expert_load_per_rank=expert_load_per_rank, schedule=schedule,
                          overhead=overhead)
