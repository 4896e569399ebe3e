"""``profile-summary``'s printed figures: what a person reads first, from ``evidence.profile``.

Per role: busy fraction, cross-role overlap, exposed bubble (Attention), straggler
with its slowest rank (FFN) and communication overlap, each a mean over the
profiled steps; per step; per collective group: ops, time, volume, bandwidth (and
per transport); the slowest layer components. An absent figure prints as
``absent`` and its reason is listed at the end: never a 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

SLOWEST_COMPONENTS = 5
US_PER_S, MS_PER_S = 1e6, 1e3
ABSENT = "absent"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _reason(value: Any) -> str | None:
    return value.get("absent_reason") if isinstance(value, Mapping) else None


def seconds_text(value: float) -> str:
    if abs(value) < 1 / MS_PER_S:
        return f"{value * US_PER_S:.1f} us"
    if abs(value) < 1:
        return f"{value * MS_PER_S:.3f} ms"
    return f"{value:.3f} s"


class _Notes:
    """Collects why each absent figure is absent (printed once, at the end)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def show(self, label: str, values: Sequence[Any], kind: str) -> str:
        numbers = [n for v in values if (n := _number(v)) is not None]
        if not numbers:
            reason = next((r for v in values if (r := _reason(v))), "no value in the profile")
            if f"{label}: {reason}" not in self.lines:
                self.lines.append(f"{label}: {reason}")
            return ABSENT
        mean = fmean(numbers)
        return f"{mean:.1%}" if kind == "ratio" else seconds_text(mean)


def _role_lines(profile: Mapping[str, Any], notes: _Notes) -> list[str]:
    steps = profile.get("per_step", [])
    lines = ["Per role (mean over profiled steps):"]
    for role, info in sorted(profile.get("roles", {}).items()):
        parts = [f"busy {notes.show(f'{role} busy fraction', [info.get('busy_fraction')], 'ratio')}",
                 "overlap with the other role "
                 + notes.show("overlap", [s.get("overlap_fraction") for s in steps], "ratio")]
        if role == "attention":
            parts.append("exposed bubble " + notes.show(
                "exposed bubble", [s.get("exposed_bubble_s") for s in steps], "s") + "/step")
        if role == "ffn":
            parts.append(_straggler_text(profile.get("straggler"), notes))
        parts.append("communication overlap " + notes.show(
            f"{role} communication overlap",
            [s.get("communication_overlap_fraction", {}).get(role) for s in steps], "ratio"))
        lines.append(f"  {role}: " + " | ".join(parts))
    return lines


def _straggler_text(record: Any, notes: _Notes) -> str:
    if _reason(record):
        return "straggler " + notes.show("straggler", [record], "s")
    total = notes.show("straggler", [record.get("total_s")], "s")
    if total == ABSENT:
        return f"straggler {ABSENT}"
    slowest = record.get("slowest_rank")
    rank = f" (slowest rank {slowest})" if isinstance(slowest, int) else ""
    return f"straggler {total}/step{rank}"


def _step_lines(profile: Mapping[str, Any], notes: _Notes) -> list[str]:
    lines = ["Per step:"]
    for step in profile.get("per_step", []):
        critical = notes.show("critical path", [step.get("critical_path_s")], "s")
        if "critical_role" in step:
            critical += f" ({step['critical_role']} rank {step['critical_rank']})"
        straggler = notes.show("straggler", [step.get("straggler_s")], "s")
        if "straggler_slowest_rank" in step:
            straggler += f" (rank {step['straggler_slowest_rank']})"
        lines.append(
            f"  step {step.get('step') or '(none)'}: overlap "
            f"{notes.show('overlap', [step.get('overlap_fraction')], 'ratio')} | exposed bubble "
            f"{notes.show('exposed bubble', [step.get('exposed_bubble_s')], 's')} | critical "
            f"path {critical} | straggler {straggler}")
    return lines


def _collective_lines(profile: Mapping[str, Any], notes: _Notes) -> list[str]:
    groups = profile.get("collectives", [])
    if not groups:
        return ["Collectives: none in the profile (no communication.json / messages)"]
    lines = ["Collectives per step and rank (volume counts each transfer once: SDMA + RDMA):"]
    for group in groups:
        label = f"{group['role']}/{group['group']}"
        bandwidth = _number(group.get("bandwidth_gb_s"))
        transports = ", ".join(
            f"{name} {t['volume_mb_per_step']:.3g} MB"
            + (f" @ {rate:.3g} GB/s" if (rate := _number(t.get("bandwidth_gb_s"))) else "")
            for name, t in sorted(group.get("transports", {}).items()))
        lines.append(
            f"  {label} ranks {group.get('ranks')}: {group['ops_per_step']:.3g} ops, time "
            f"{notes.show(f'{label} time', [group.get('time_s_per_step')], 's')}, volume "
            f"{group['volume_mb_per_step']:.3g} MB, bandwidth "
            + (f"{bandwidth:.3g} GB/s" if bandwidth is not None else notes.show(
                f"{label} bandwidth", [group.get("bandwidth_gb_s")], "ratio"))
            + (f" [{transports}]" if transports else ""))
    return lines


def _component_lines(profile: Mapping[str, Any]) -> list[str]:
    rows = sorted(profile.get("per_layer", []), key=lambda r: r["seconds"], reverse=True)
    lines = [f"Slowest layer components (top {SLOWEST_COMPONENTS}, s per step, rank mean / "
             "slowest rank):"]
    for row in rows[:SLOWEST_COMPONENTS]:
        layer = f"L{row['layer']}" if row["layer"] >= 0 else "no layer"
        lines.append(f"  {row['role']} {layer} {row['range']} {row['component']}: "
                     f"{seconds_text(row['seconds'])} / {seconds_text(row['max_rank_seconds'])}")
    if not rows:
        lines.append("  none: the profile holds no kernel")
    return lines


def render(profile: Mapping[str, Any]) -> str:
    """The figures of one ``evidence.profile`` as text."""
    notes = _Notes()
    analyzer = profile.get("analyzer", {})
    lines = [f"Profile ({profile.get('source')}, {analyzer.get('name')} "
             f"{analyzer.get('version')})"]
    for part in (_role_lines(profile, notes), _step_lines(profile, notes),
                 _collective_lines(profile, notes), _component_lines(profile)):
        lines += ["", *part]
    if notes.lines:
        lines += ["", "Absent (unknown, not 0):", *(f"  {line}" for line in notes.lines)]
    return "\n".join(lines)
