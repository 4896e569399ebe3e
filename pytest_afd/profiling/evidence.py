"""The ``evidence.profile`` record of an instrumented run, from any trace source.

Sources (``ascend`` for torch_npu ``*_ascend_pt`` trees, ``torch_trace`` for
CPU ``torch.profiler`` traces) reduce to the same :class:`RoleData`: per rank,
classified work items and a per-step step trace; per role, collectives. Every
figure below is computed from those, the same way for both sources.
Definitions (docs/profiling.md):

- ``per_layer``: seconds per step (mean over the role's ranks, and the slowest
  rank's) by role, layer, stage (ubatch; -1 whole batch), range and component;
- ``per_step``: cross-role ``overlap_fraction`` (the CPU runtime's definition),
  ``exposed_bubble_s`` (the worst Attention rank's Free + Bubble + time in
  ``wait`` ranges), ``critical_path_s`` (the slowest rank's Stage time) and who;
- ``straggler``: per MoE layer, the FFN ranks' routed-expert seconds, max - mean;
- ``busy_fraction`` per role: 1 - (Free + Bubble) / (Computing +
  Communication(Not Overlapped) + Free) over its ranks and steps;
- ``collectives``: per role and group, ops, time, transit volume and bandwidth.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from statistics import fmean
from typing import Any

from afd_split.ranges import RangeTag
from pytest_afd.core.absent import absent
from pytest_afd.profiling import overlap, straggler
from pytest_afd.profiling.components import UNCLASSIFIED, classify
from pytest_afd.profiling.timebase import NS_PER_MS, seconds

ATTENTION_ROLE = "attention"
FFN_ROLE = "ffn"
# Ranges in which a role waits on its peer: not busy time.
WAIT_RANGES = frozenset({"wait", "ffn_idle"})
MAX_LISTED_NAMES = 5


@dataclass(frozen=True)
class WorkItem:
    """One kernel (or CPU range) of one rank, times in integer nanoseconds (profiling.timebase)."""

    step: str
    name: str
    op_type: str
    start_ns: int
    duration_ns: int
    tag: RangeTag | None

    @property
    def stage_name(self) -> str | None:
        return self.tag.stage if self.tag else None

    @property
    def component(self) -> str:
        return classify(self.op_type, self.stage_name)

    @property
    def interval(self) -> tuple[int, int]:
        return (self.start_ns, self.start_ns + self.duration_ns)

    @property
    def duration_s(self) -> float:
        return seconds(self.duration_ns)

    @property
    def busy(self) -> bool:
        return self.stage_name not in WAIT_RANGES


# A rank's step trace row: msprof-analyze's columns in integer ns, None where unknown.
StepTrace = dict[str, "int | None"]


@dataclass
class RankData:
    rank: int
    items: list[WorkItem]
    steps: dict[str, StepTrace]  # step -> step-trace nanoseconds


@dataclass
class RoleData:
    role: str
    ranks: list[RankData]
    collectives: list[dict[str, Any]] = field(default_factory=list)

    def steps(self) -> list[str]:
        found = {s for rank in self.ranks for s in rank.steps}
        found |= {item.step for rank in self.ranks for item in rank.items}
        return sorted(found, key=_step_key)


def _step_key(step: str) -> tuple[int, str]:
    return (int(step), step) if step.lstrip("-").isdigit() else (1 << 30, step)


def per_layer(roles: Sequence[RoleData]) -> list[dict[str, Any]]:
    """Seconds per step by (role, layer, stage, range, component): rank mean and slowest rank.

    A rank with no kernel of a key ran none (the export lists every kernel), so its
    time for that key is 0 as the input says, not an unknown.
    """
    records = []
    for role in roles:
        num_steps = max(1, len(role.steps()))
        per_rank: dict[tuple, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        for rank in role.ranks:
            for item in rank.items:
                tag = item.tag
                key = (tag.layer if tag else -1, tag.ubatch if tag else -1,
                       item.stage_name or "none", item.component)
                per_rank[key][rank.rank] += item.duration_ns
        for (layer, stage, range_kind, component), by_rank in sorted(per_rank.items()):
            values = [by_rank.get(rank.rank, 0) for rank in role.ranks]
            records.append({"role": role.role, "layer": layer, "stage": stage,
                            "range": range_kind, "component": component,
                            "seconds": seconds(Fraction(sum(values), len(values) * num_steps)),
                            "max_rank_seconds": seconds(Fraction(max(values), num_steps))})
    return records


def unclassified(roles: Sequence[RoleData]) -> list[dict[str, Any]]:
    """Every unknown operator type, by role: count, seconds and a few kernel names."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    nanos: dict[tuple[str, str], int] = defaultdict(int)
    for role in roles:
        for rank in role.ranks:
            for item in rank.items:
                if item.component != UNCLASSIFIED:
                    continue
                key = (role.role, item.op_type)
                entry = found.setdefault(key, {
                    "role": role.role, "type": item.op_type, "count": 0, "names": []})
                entry["count"] += 1
                nanos[key] += item.duration_ns
                if item.name not in entry["names"] and len(entry["names"]) < MAX_LISTED_NAMES:
                    entry["names"].append(item.name)
    return [{**found[key], "seconds": seconds(nanos[key])} for key in sorted(found)]


def _busy_intervals(role: RoleData, step: str) -> list[tuple[int, int]]:
    return [i.interval for r in role.ranks for i in r.items if i.step == step and i.busy]


def _exposed_bubble(attention: RoleData, step: str) -> float | dict:
    """The worst Attention rank's Free + Bubble + time in wait ranges, or why it is unknown."""
    worst = None
    for rank in attention.ranks:
        row = rank.steps.get(step)
        if row is None:
            return absent(f"Attention rank {rank.rank} has no step-trace row for step {step!r}")
        if row.get("free_ns") is None or row.get("bubble_ns") is None:
            return absent(f"Attention rank {rank.rank}'s step trace has no Free/Bubble "
                          f"for step {step!r}")
        waiting = sum(i.duration_ns for i in rank.items if i.step == step and not i.busy)
        total = row["free_ns"] + row["bubble_ns"] + waiting
        worst = total if worst is None else max(worst, total)
    return seconds(worst) if worst is not None else absent("no Attention rank")


def _critical_path(roles: Mapping[str, RoleData], step: str) -> dict[str, Any]:
    stages = [(rank.steps[step]["stage_ns"], role.role, rank.rank)
              for role in roles.values() for rank in role.ranks
              if step in rank.steps and rank.steps[step].get("stage_ns") is not None]
    if not stages:
        return {"critical_path_s": absent(f"no step-trace Stage time for step {step!r}")}
    nanos, role_name, rank_id = max(stages)
    return {"critical_path_s": seconds(nanos), "critical_role": role_name,
            "critical_rank": rank_id}


def per_step(roles: Mapping[str, RoleData]) -> list[dict[str, Any]]:
    attention, ffn = roles.get(ATTENTION_ROLE), roles.get(FFN_ROLE)
    steps = sorted({s for role in roles.values() for s in role.steps()}, key=_step_key)
    records = []
    for step in steps:
        record: dict[str, Any] = {"step": step}
        if attention is not None and ffn is not None:
            fraction = overlap.overlap_fraction(_busy_intervals(attention, step),
                                                _busy_intervals(ffn, step))
            record["overlap_fraction"] = fraction if fraction is not None else absent(
                "one role did no work in this step")
        else:
            record["overlap_fraction"] = absent("needs profiles of both roles")
        record["exposed_bubble_s"] = (_exposed_bubble(attention, step) if attention is not None
                                      else absent("no Attention-side profile"))
        record.update(_critical_path(roles, step))
        figure = straggler.step_straggler(ffn, step)
        record["straggler_s"] = figure.get("straggler_s", figure)
        if "slowest_rank" in figure:
            record["straggler_slowest_rank"] = figure["slowest_rank"]
        record["communication_overlap_fraction"] = {
            role.role: _comm_overlap(role, step) for role in roles.values()}
        records.append(record)
    return records


# Per-step fields Stage A (top level) and Stage E (``profile.critical_path_s``) read.
STEP_FIELDS = ("overlap_fraction", "straggler_s", "exposed_bubble_s")


def attach_to_steps(steps: list[dict[str, Any]], profile: Mapping[str, Any]) -> str | None:
    """Copy each profiled step's figures onto the run's step records, in order.

    Only when the profile captured exactly the run's steps (the computed schedule);
    returns why nothing was attached otherwise.
    """
    per_step = profile.get("per_step", [])
    if len(per_step) != len(steps):
        return (f"the profile has {len(per_step)} step(s) and the run {len(steps)}: "
                "the schedule did not capture exactly this run's steps")
    for step, record in zip(steps, per_step, strict=True):
        numeric = {k: record[k] for k in (*STEP_FIELDS, "critical_path_s")
                   if isinstance(record.get(k), (int, float))}
        step["profile"] = numeric
        step.update({k: v for k, v in numeric.items() if k in STEP_FIELDS})
    return None


def _comm_overlap(role: RoleData, step: str) -> float | dict:
    rows = [rank.steps[step] for rank in role.ranks if step in rank.steps]
    if not rows:
        return absent(f"no step-trace row for step {step!r}")
    if any(row.get("communication_ns") is None or row.get("overlapped_ns") is None
           for row in rows):
        return absent("the step trace has no Communication/Overlapped column")
    total = sum(row["communication_ns"] for row in rows)
    if total <= 0:
        return absent("no collective in this step")
    return sum(row["overlapped_ns"] for row in rows) / total


BUSY_COLUMNS = ("computing_ns", "communication_not_overlapped_ns", "free_ns", "bubble_ns")


def busy_fraction(role: RoleData) -> float | dict:
    rows = [row for rank in role.ranks for row in rank.steps.values()]
    if not rows:
        return absent(f"no step trace for the {role.role} role")
    if any(row.get(column) is None for row in rows for column in BUSY_COLUMNS):
        return absent(f"the {role.role} role's step trace lacks one of {BUSY_COLUMNS}")
    e2e = sum(r["computing_ns"] + r["communication_not_overlapped_ns"] + r["free_ns"]
              for r in rows)
    if e2e <= 0:
        return absent(f"the {role.role} role's step trace spans no time")
    idle = sum(r["free_ns"] + r["bubble_ns"] for r in rows)
    return max(0.0, 1.0 - idle / e2e)


def collectives(roles: Sequence[RoleData]) -> list[dict[str, Any]]:
    """Per role and group, per step (mean over steps and ranks): ops, time, volume, bandwidth.

    Each record's volume and transit time already count a transfer once
    (``msprof.collectives``: SDMA + RDMA); bandwidth is volume / transit time, per
    transport too, as msprof-analyze's communication analysis computes it.
    """
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for role in roles:
        for record in role.collectives:
            grouped[(role.role, record["group"])].append(record)
    return [_group_figures(role, group, records) for (role, group), records in
            sorted(grouped.items())]


def _group_figures(role: str, group: str, records: list[dict]) -> dict[str, Any]:
    steps = {r["step"] for r in records}
    ranks = {r["rank"] for r in records}
    per = len(steps) * len(ranks)
    times = [r["time_ns"] for r in records]
    out: dict[str, Any] = {
        "role": role, "group": group, "ranks": sorted(ranks),
        "ops_per_step": sum(r["num_ops"] for r in records) / per,
        "time_s_per_step": (seconds(sum(times) / per) if None not in times else
                            absent("a rank's communication.json has no Elapse Time(ms)"))}
    out.update(_volume_figures(records, per))
    return out


def _volume_figures(records: list[dict], per: int) -> dict[str, Any]:
    volume = sum(r["volume_mb"] for r in records)
    transit = sum(r["transit_time_ns"] for r in records)
    transports: dict[str, dict[str, Any]] = {}
    for name in sorted({t for r in records for t in r.get("transports", {})}):
        size = sum(r["transports"].get(name, {}).get("volume_mb", 0.0) for r in records)
        nanos = sum(r["transports"].get(name, {}).get("transit_time_ns", 0) for r in records)
        transports[name] = {
            "volume_mb_per_step": size / per,
            "bandwidth_gb_s": size / (nanos / NS_PER_MS) if nanos > 0 else absent(
                f"no {name} transit time recorded")}
    return {"volume_mb_per_step": volume / per,
            "bandwidth_gb_s": volume / (transit / NS_PER_MS) if transit > 0 else absent(
                "no transit time recorded"),
            "transports": transports}


def build(roles: Mapping[str, RoleData], *, source: str, analyzer: Mapping[str, Any],
          expert_load_per_rank: Sequence[Sequence[int]] | None = None,
          schedule: Mapping[str, Any] | dict | None = None,
          overhead: Mapping[str, Any] | dict | None = None) -> dict[str, Any]:
    """The ``evidence.profile`` record (schemas/result.schema.json ``profile``)."""
    ordered = [roles[name] for name in sorted(roles)]
    return {
        "source": source,
        "analyzer": dict(analyzer),
        "roles": {role.role: {"ranks": [r.rank for r in role.ranks], "steps": role.steps(),
                              "busy_fraction": busy_fraction(role)} for role in ordered},
        "per_layer": per_layer(ordered),
        "unclassified": unclassified(ordered),
        "per_step": per_step(roles),
        "straggler": straggler.summary(roles.get(FFN_ROLE), expert_load_per_rank),
        "collectives": collectives(ordered),
        "schedule": dict(schedule) if schedule else absent("the profile's schedule was not given"),
        "profiler_overhead": dict(overhead) if overhead else absent(
            "no non-instrumented run of the same case to compare with"),
    }


def with_overhead(profile: dict[str, Any], instrumented_wall_s: float,
                  measured_wall_s: Sequence[float]) -> dict[str, Any]:
    """``profile`` with ``profiler_overhead`` from the case's own runs, unless it has one."""
    current = profile.get("profiler_overhead")
    if isinstance(current, Mapping) and "ratio" in current:
        return profile
    walls = sorted(w for w in measured_wall_s if w > 0)
    if not walls or instrumented_wall_s <= 0:
        return profile
    median = walls[len(walls) // 2] if len(walls) % 2 else fmean(walls[len(walls) // 2 - 1:
                                                                      len(walls) // 2 + 1])
    return {**profile, "profiler_overhead": {
        "instrumented_wall_s": instrumented_wall_s, "non_instrumented_wall_s": median,
        "non_instrumented_runs": len(walls), "ratio": instrumented_wall_s / median}}
