"""The report's table of each instrumented case's profile evidence (docs/profiling.md):
overlap, bubble, critical path, straggler, collectives, busy fractions, profiler overhead."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

from pytest_afd.report.loading import LoadedResult
from pytest_afd.report.profile_plots import result_profile
from pytest_afd.report.tables import EMPTY, fmt, table

HEADER = ("case", "policy", "overlap (mean)", "exposed bubble s (mean)",
          "critical path s (mean)", "FFN straggler s", "collectives per step",
          "busy Attention / FFN", "profiler overhead")
MB_PER_GB = 1e3
MS_PER_S = 1e3


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _mean_of(steps: Sequence[Mapping[str, Any]], key: str) -> str:
    values = [v for v in (_number(step.get(key)) for step in steps) if v is not None]
    return fmt(fmean(values)) if values else EMPTY


def _ms(value: Any) -> str:
    seconds = _number(value)
    return EMPTY if seconds is None else f"{seconds * MS_PER_S:.3g} ms"  # absent: unknown


def _collectives(profile: Mapping[str, Any]) -> str:
    parts = [f"{c['role']}/{c['group']}: {c['ops_per_step']:.3g} ops, "
             f"{_ms(c['time_s_per_step'])}, {c['volume_mb_per_step']:.3g} MB"
             for c in profile.get("collectives", [])]
    return "; ".join(parts) or EMPTY


def _busy(profile: Mapping[str, Any]) -> str:
    roles = profile.get("roles", {})
    return " / ".join(fmt(_number(roles.get(role, {}).get("busy_fraction")))
                      for role in ("attention", "ffn"))


def profile_row(result: LoadedResult, profile: Mapping[str, Any]) -> list[str]:
    steps = profile.get("per_step", [])
    straggler = profile.get("straggler", {})
    overhead = profile.get("profiler_overhead", {})
    ratio = _number(overhead.get("ratio")) if isinstance(overhead, Mapping) else None
    return [result.case_id, result.policy, _mean_of(steps, "overlap_fraction"),
            _mean_of(steps, "exposed_bubble_s"), _mean_of(steps, "critical_path_s"),
            fmt(_number(straggler.get("total_s"))) if isinstance(straggler, Mapping) else EMPTY,
            _collectives(profile), _busy(profile),
            EMPTY if ratio is None else f"x{ratio:.3g} (instrumented / measured wall)"]


def profile_table(results: Sequence[LoadedResult]) -> list[str]:
    """One row per instrumented case with a profile; nothing when none has one."""
    rows = [profile_row(r, profile) for r in results
            if (profile := result_profile(r.doc)) is not None]
    if not rows:
        return []
    return ["Profile evidence of the instrumented runs (never headline numbers):", "",
            *table(HEADER, rows), ""]
