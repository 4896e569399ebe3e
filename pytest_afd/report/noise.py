"""What noise a comparison must beat: the host conditions of each side and stored A/A calibrations.

A change between A and B is called only beyond a noise floor measured on the
same host: the larger coefficient of variation of the two sides' repetitions
and, when one is given, a named A/A calibration (two runs of the same code,
compared with ``compare --calibrate``; its per-case |B / A - 1| is noise by
construction).

Contention is judged by what each repetition actually got: its CPU share (CPU
time over wall time, recorded per repetition by pytest_afd.stats.host), not by the
1-minute load average, which lags a change by a minute or more (issue 40: an A/A
pair whose load was still rising read "load 2.6 -> 3.8" and every case went
inconclusive). Two sides whose median CPU shares lie within
:data:`CPU_SHARE_TOLERANCE` ran under the same contention, whatever the load
averages say. When the shares differ, wall-time metrics are "inconclusive: host
conditions differ (CPU share a -> b ...)" and CPU time is compared above
:data:`CPU_CONTENTION_FLOOR`. Results without per-repetition CPU times fall back
to the load rule: wall-time metrics inconclusive when the loads differ; CPU time
still compared with a higher floor unless either side was oversubscribed.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_afd.results.documents import atomic_write_json

# Two load readings (1-minute averages) per CPU further apart than this are different hosts.
HOST_LOAD_TOLERANCE_PER_CPU = 0.5
# How much a busier (not oversubscribed) host can stretch the CPU time of the same work
# (SMT, caches, frequency).
CPU_CONTENTION_FLOOR = 0.15
# Beyond one runnable task per CPU, CPU time itself stretches without bound: measured here,
# the same Stage A cases took 2x the CPU seconds at load 14 as at load 7 on 2 CPUs.
OVERSUBSCRIBED_LOAD_PER_CPU = 1.0
ONE_MINUTE = 0
# Median CPU shares of A and B within this factor either way: the same contention.
CPU_SHARE_TOLERANCE = 0.15
INCONCLUSIVE_HOST = "inconclusive: host conditions differ"
CALIBRATION_KIND = "afd-calibration"
CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class HostConditions:
    cpu_count: int
    # Mean 1-minute load average over every repetition's before/after reading.
    load: float
    # Per repetition: CPU time over wall time (empty when a wall time was 0).
    shares: tuple[float, ...] = ()

    @property
    def load_per_cpu(self) -> float:
        return self.load / self.cpu_count

    @property
    def cpu_share(self) -> float | None:
        """Median CPU share over the repetitions; None when not every one has one."""
        if not self.shares:
            return None
        ordered = sorted(self.shares)
        middle = len(ordered) // 2
        return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def repetition_shares(host: Mapping[str, Any]) -> tuple[float, ...]:
    """Each repetition's CPU share (recorded, else CPU time / wall time); () when any
    repetition's wall time is 0."""
    shares = []
    for rep in host["repetitions"]:
        if "cpu_share" in rep:
            shares.append(float(rep["cpu_share"]))
        elif float(rep["wall_time_s"]) > 0:
            shares.append(float(rep["cpu_time_s"]) / float(rep["wall_time_s"]))
        else:
            return ()
    return tuple(shares) if all(share > 0 for share in shares) else ()


def host_conditions(doc: Mapping[str, Any]) -> HostConditions | None:
    """The recorded host conditions of a result; None for results written before they were."""
    host = doc.get("host")
    if not isinstance(host, Mapping):
        return None
    readings = [
        reading[ONE_MINUTE]
        for rep in host["repetitions"]
        for reading in (rep["load_before"], rep["load_after"])
    ]
    return HostConditions(int(host["cpu_count"]), sum(readings) / len(readings),
                          repetition_shares(host))


def shares_differ(a: HostConditions, b: HostConditions) -> bool | None:
    """Whether A's and B's median CPU shares differ beyond :data:`CPU_SHARE_TOLERANCE`;
    None when either side has none."""
    if a.cpu_share is None or b.cpu_share is None:
        return None
    return abs(math.log(b.cpu_share / a.cpu_share)) > math.log1p(CPU_SHARE_TOLERANCE)


def oversubscribed(a: HostConditions | None, b: HostConditions | None) -> bool:
    """Either side ran with more runnable tasks than CPUs: even CPU time is not comparable."""
    return any(h is not None and h.load_per_cpu > OVERSUBSCRIBED_LOAD_PER_CPU for h in (a, b))


def host_text(host: HostConditions | None) -> str:
    if host is None:
        return "not recorded"
    share = "" if host.cpu_share is None else f", CPU share {host.cpu_share:.2f}"
    return f"load {host.load:.2g} / {host.cpu_count} CPUs{share}"


def host_difference(a: HostConditions | None, b: HostConditions | None) -> str | None:
    """``"load 0.3 → 5.1"`` (or the CPU counts) when A's and B's hosts differ; None when alike.

    With per-repetition CPU shares on both sides, only the shares decide (see
    :func:`share_difference`); the load averages are named beside them. Unrecorded
    conditions are not a difference (they are named in the notes instead).
    """
    if a is None or b is None:
        return None
    if a.cpu_count != b.cpu_count:
        return f"CPUs {a.cpu_count} → {b.cpu_count}, load {a.load:.2g} → {b.load:.2g}"
    if shares_differ(a, b) is not None:
        return None
    if abs(a.load_per_cpu - b.load_per_cpu) > HOST_LOAD_TOLERANCE_PER_CPU:
        return f"load {a.load:.2g} → {b.load:.2g}"
    return None


def share_difference(a: HostConditions | None, b: HostConditions | None) -> str | None:
    """``"CPU share 0.52 → 0.31 (load 2.6 → 3.8)"`` when both sides recorded CPU shares and
    they differ beyond :data:`CPU_SHARE_TOLERANCE` on the same CPU count."""
    if a is None or b is None or a.cpu_count != b.cpu_count or not shares_differ(a, b):
        return None
    return (f"CPU share {a.cpu_share:.2f} → {b.cpu_share:.2f} "
            f"(load {a.load:.2g} → {b.load:.2g})")


# --- A/A calibrations -----------------------------------------------------------------------
CALIBRATION_ENV = "AFD_CALIBRATION"
CALIBRATION_DIR_NAME = "pytest-afd"


def default_calibration_path() -> Path:
    """Where ``compare --calibrate`` stores this host's A/A calibration and ``compare`` reads it.

    ``$AFD_CALIBRATION`` when set, else ``$XDG_CACHE_HOME/pytest-afd/calibration-<host>.json``
    (``~/.cache`` without XDG_CACHE_HOME): between-session noise belongs to a host, not to a
    results directory.
    """
    override = os.environ.get(CALIBRATION_ENV)
    if override:
        return Path(override)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / CALIBRATION_DIR_NAME / f"calibration-{socket.gethostname()}.json"


@dataclass(frozen=True)
class Calibration:
    """Per case and metric the widest |B / A - 1| its A/A pairs showed (noise, by construction),
    and per stage and metric the widest move of the stage's geometric mean."""

    name: str
    path: Path
    floors: Mapping[str, Mapping[str, float]]
    stage_floors: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    runs: int = 2

    def floor(self, case_id: str, metric: str) -> tuple[float, str] | None:
        """(floor, where from): the case's own A/A deviation, else the metric's widest."""
        own = self.floors.get(case_id, {}).get(metric)
        if own is not None:
            return own, f"A/A {self.name!r}"
        widest = [floors[metric] for floors in self.floors.values() if metric in floors]
        if not widest:
            return None
        return max(widest), f"A/A {self.name!r} (widest case)"

    def stage_floor(self, stage: str, metric: str) -> float | None:
        return self.stage_floors.get(stage, {}).get(metric)


def calibration_doc(
    name: str, sides: Sequence[str], deviations: Mapping[str, Mapping[str, float]],
    hosts: Mapping[str, Sequence[str]],
    stage_deviations: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """The stored calibration: the runs, their host conditions and every case's deviation."""
    return {
        "kind": CALIBRATION_KIND,
        "version": CALIBRATION_VERSION,
        "name": name,
        "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "sides": list(sides),
        "hosts": {case: list(pair) for case, pair in sorted(hosts.items())},
        "floors": {case: dict(sorted(m.items())) for case, m in sorted(deviations.items())},
        "stage_floors": {stage: dict(sorted(m.items()))
                         for stage, m in sorted((stage_deviations or {}).items())},
    }


def write_calibration(path: Path, doc: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_json(path, doc)


def read_calibration(path: Path, source: str = "--calibration") -> Calibration:
    """A stored calibration; ValueError naming the file (and the flag) when it is not one."""
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{source} {str(path)!r}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source} {str(path)!r}: not JSON: {exc}") from None
    if not isinstance(doc, Mapping) or doc.get("kind") != CALIBRATION_KIND:
        raise ValueError(
            f"{source} {str(path)!r}: not a calibration (kind {CALIBRATION_KIND!r}); write one "
            "with 'pytest-afd compare --calibrate RUN RUN [RUN...]'"
        )

    def _floats(table: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        return {str(key): {str(m): float(v) for m, v in metrics.items()}
                for key, metrics in table.items()}

    return Calibration(str(doc["name"]), path, _floats(doc["floors"]),
                       _floats(doc.get("stage_floors", {})), len(doc.get("sides", ())))
