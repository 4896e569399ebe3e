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
from statistics import fmean
from typing import Any

from afd_split.ranges import RangeTag
from pytest_afd.profiling import overlap
from pytest_afd.profiling.components import ROUTED_MOE, UNCLASSIFIED, classify
from pytest_afd.results.manifest import absent

ATTENTION_ROLE = "attention"
FFN_ROLE = "ffn"
# Ranges in which a role waits on its peer: not busy time.
WAIT_RANGES = frozenset({"wait", "ffn_idle"})
MAX_LISTED_NAMES = 5


@dataclass(frozen=True)
class WorkItem:
    step: str
    name: str
    op_type: str
    start_s: float
    duration_s: float
    tag: RangeTag | None

    @property
    def stage_name(self) -> str | None:
        return self.tag.stage if self.tag else None

    @property
    def component(self) -> str:
        return classify(self.op_type, self.stage_name)

    @property
    def interval(self) -> tuple[float, float]:
        return (self.start_s, self.start_s + self.duration_s)

    @property
    def busy(self) -> bool:
        return self.stage_name not in WAIT_RANGES


@dataclass
class RankData:
    rank: int
    items: list[WorkItem]
    steps: dict[str, dict[str, float]]  # step -> step-trace seconds


@dataclass
class RoleData:
    role: str
    ranks: list[RankData]
    collectives: list[dict[str, Any]] = field(default_factory=list)

    def steps(self) -> list[str]:
        return sorted({s for rank in self.ranks for s in rank.steps}, key=_step_key)


def _step_key(step: str) -> tuple[int, str]:
    return (int(step), step) if step.lstrip("-").isdigit() else (1 << 30, step)


def per_layer(roles: Sequence[RoleData]) -> list[dict[str, Any]]:
    """Seconds per step by (role, layer, stage, range, component): rank mean and slowest rank."""
    records = []
    for role in roles:
        num_steps = max(1, len(role.steps()))
        per_rank: dict[tuple, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for rank in role.ranks:
            for item in rank.items:
                tag = item.tag
                key = (tag.layer if tag else -1, tag.ubatch if tag else -1,
                       item.stage_name or "none", item.component)
                per_rank[key][rank.rank] += item.duration_s / num_steps
        for (layer, stage, range_kind, component), by_rank in sorted(per_rank.items()):
            values = [by_rank.get(rank.rank, 0.0) for rank in role.ranks]
            records.append({"role": role.role, "layer": layer, "stage": stage,
                            "range": range_kind, "component": component,
                            "seconds": fmean(values), "max_rank_seconds": max(values)})
    return records


def unclassified(roles: Sequence[RoleData]) -> list[dict[str, Any]]:
    """Every unknown operator type, by role: count, seconds and a few kernel names."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for role in roles:
        for rank in role.ranks:
            for item in rank.items:
                if item.component != UNCLASSIFIED:
                    continue
                entry = found.setdefault((role.role, item.op_type), {
                    "role": role.role, "type": item.op_type, "count": 0, "seconds": 0.0,
                    "names": []})
                entry["count"] += 1
                entry["seconds"] += item.duration_s
                if item.name not in entry["names"] and len(entry["names"]) < MAX_LISTED_NAMES:
                    entry["names"].append(item.name)
    return [found[key] for key in sorted(found)]


def _busy_intervals(role: RoleData, step: str) -> list[tuple[float, float]]:
    return [i.interval for r in role.ranks for i in r.items if i.step == step and i.busy]


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
        if attention is not None:
            record["exposed_bubble_s"] = max(
                rank.steps.get(step, {}).get("free_s", 0.0)
                + rank.steps.get(step, {}).get("bubble_s", 0.0)
                + sum(i.duration_s for i in rank.items if i.step == step and not i.busy)
                for rank in attention.ranks)
        else:
            record["exposed_bubble_s"] = absent("no Attention-side profile")
        stages = [(rank.steps[step]["stage_s"], role.role, rank.rank)
                  for role in roles.values() for rank in role.ranks if step in rank.steps]
        if stages:
            seconds, role_name, rank_id = max(stages)
            record.update(critical_path_s=seconds, critical_role=role_name, critical_rank=rank_id)
        else:
            record.update(critical_path_s=absent("no step trace for this step"))
        if ffn is not None:
            record["straggler_s"] = _step_straggler(ffn, step)
        comm = {role.role: _comm_overlap(role, step) for role in roles.values()}
        record["communication_overlap_fraction"] = comm
        records.append(record)
    return records


def _step_straggler(ffn: RoleData, step: str) -> float:
    """Sum over MoE layers of max - mean routed-expert seconds across FFN ranks in ``step``."""
    by_layer: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for rank in ffn.ranks:
        for item in rank.items:
            if (item.step == step and item.component == ROUTED_MOE and item.tag is not None
                    and item.tag.layer >= 0):
                by_layer[item.tag.layer][rank.rank] += item.duration_s
    total = 0.0
    for per_rank in by_layer.values():
        values = [per_rank.get(rank.rank, 0.0) for rank in ffn.ranks]
        total += max(values) - fmean(values)
    return total


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
    total = sum(row["communication_s"] for row in rows)
    if total <= 0:
        return absent("no collective in this step")
    return sum(row["overlapped_s"] for row in rows) / total


def busy_fraction(role: RoleData) -> float | dict:
    rows = [row for rank in role.ranks for row in rank.steps.values()]
    e2e = sum(r["computing_s"] + r["communication_not_overlapped_s"] + r["free_s"] for r in rows)
    if e2e <= 0:
        return absent(f"no step trace for the {role.role} role")
    idle = sum(r["free_s"] + r["bubble_s"] for r in rows)
    return max(0.0, 1.0 - idle / e2e)


def straggler(ffn: RoleData | None,
              expert_load_per_rank: Sequence[Sequence[int]] | None) -> dict[str, Any]:
    """Per MoE layer: each FFN rank's routed-expert seconds per step, and max - mean."""
    if ffn is None:
        return absent("no FFN-side profile")
    num_steps = max(1, len(ffn.steps()))
    by_layer: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for rank in ffn.ranks:
        for item in rank.items:
            if item.component == ROUTED_MOE and item.tag is not None and item.tag.layer >= 0:
                by_layer[item.tag.layer][rank.rank] += item.duration_s / num_steps
    layers = []
    for layer in sorted(by_layer):
        values = [by_layer[layer].get(rank.rank, 0.0) for rank in ffn.ranks]
        slowest = max(range(len(values)), key=values.__getitem__)
        layers.append({"layer": layer, "per_rank_s": values,
                       "straggler_s": max(values) - fmean(values),
                       "slowest_rank": ffn.ranks[slowest].rank})
    load = ([list(map(int, row)) for row in expert_load_per_rank] if expert_load_per_rank
            else absent("the run reported no per-rank expert load for these steps"))
    return {"per_layer": layers, "total_s": sum(e["straggler_s"] for e in layers),
            "expert_load_per_rank": load}


def collectives(roles: Sequence[RoleData]) -> list[dict[str, Any]]:
    """Per role and group, per step (mean over steps and ranks): ops, time, volume, bandwidth."""
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for role in roles:
        for record in role.collectives:
            grouped[(role.role, record["group"])].append(record)
    out = []
    for (role, group), records in sorted(grouped.items()):
        steps = {r["step"] for r in records}
        ranks = {r["rank"] for r in records}
        per = max(1, len(steps) * len(ranks))
        transit = sum(r["transit_time_s"] for r in records)
        volume = sum(r["volume_mb"] for r in records)
        out.append({"role": role, "group": group, "ranks": sorted(ranks),
                    "ops_per_step": sum(r["num_ops"] for r in records) / per,
                    "time_s_per_step": sum(r["time_s"] for r in records) / per,
                    "volume_mb_per_step": volume / per,
                    "bandwidth_gb_s": volume / (transit * 1e3) if transit > 0 else absent(
                        "no transit time recorded")})
    return out


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
        "straggler": straggler(roles.get(FFN_ROLE), expert_load_per_rank),
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
