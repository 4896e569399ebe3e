"""CPU ``torch.profiler`` traces of the AFD runtime -> :class:`RoleData`, then the same evidence.

Layout (``pytest_afd.backends.cpu.afd.tracing``): ``<root>/<role>/rank<i>/step<n>.pt.trace.json``.
Each ``afd|<stage>|L<layer>|U<ubatch>`` range (``user_annotation``) is one work
item: on a CPU the torch ops inside run synchronously, so the range's time is
the stage's time. Per rank and step, the msprof-analyze step-trace quantities
are computed with its own interval code (``overlap.step_trace``): message
ranges (dispatch, recv, send) are communication, ``wait`` is bubble.
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

SOURCE = "torch_trace"
US_PER_S = 1e6
COMMUNICATION_STAGES = frozenset({"dispatch", "recv", "send"})
_RANK_DIR = re.compile(r"^rank(\d+)$")
_STEP_FILE = re.compile(r"^step(\d+)\.pt\.trace\.json$")


def analyzer() -> dict[str, str]:
    return {"name": "torch.profiler + msprof-analyze",
            "version": f"torch {importlib.metadata.version('torch')}, msprof-analyze "
                       f"{importlib.metadata.version('msprof-analyze')}"}


def read_items(path: Path, step: str) -> list[evidence.WorkItem]:
    """The AFD ranges of one Chrome trace as work items (other events are not stages)."""
    doc = file_manager().read_json_file(str(path))
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    items = []
    for event in events:
        tag = parse_range(str(event.get("name", ""))) if event.get("ph") == "X" else None
        if tag is None:
            continue
        items.append(evidence.WorkItem(step, event["name"], RANGE_TYPE,
                                       float(event["ts"]) / US_PER_S,
                                       float(event.get("dur", 0.0)) / US_PER_S, tag))
    return items


def rank_step_trace(items: list[evidence.WorkItem]) -> dict[str, float]:
    if not items:
        return overlap.step_trace([], [], (0.0, 0.0))
    blocked = [i.interval for i in items if not i.busy]
    comm = [i.interval for i in items if i.busy and i.stage_name in COMMUNICATION_STAGES]
    busy = [i.interval for i in items if i.busy and i.stage_name not in COMMUNICATION_STAGES]
    window = (min(i.start_s for i in items), max(i.start_s + i.duration_s for i in items))
    trace = overlap.step_trace(busy, comm, window, blocked)
    trace["bubble_s"] = overlap.union_length(blocked)
    return trace


def load_role(role: str, role_dir: Path) -> evidence.RoleData:
    ranks = []
    for rank_dir in sorted(Path(role_dir).iterdir()):
        match = _RANK_DIR.match(rank_dir.name)
        if not match or not rank_dir.is_dir():
            continue
        items, steps = [], {}
        for path in sorted(rank_dir.iterdir()):
            step_match = _STEP_FILE.match(path.name)
            if step_match is None:
                continue
            step_items = read_items(path, step_match.group(1))
            items += step_items
            steps[step_match.group(1)] = rank_step_trace(step_items)
        ranks.append(evidence.RankData(int(match.group(1)), items, steps))
    if not ranks:
        raise ValueError(f"{str(role_dir)!r}: no rank<i>/step<n>.pt.trace.json traces")
    return evidence.RoleData(role, ranks)


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
