"""Host conditions of a measurement: load averages around each repetition, CPU count, CPU time.

A slower host and slower code both lengthen wall time; only a record of the
host tells them apart. :func:`measured_run` wraps one backend run and attaches a
:class:`HostSample` (load averages before and after, wall time, this process's
CPU time and, for AFD processes, each rank's CPU time from the step evidence)
to its :class:`~pytest_afd.core.backend.RunOutputs`; :func:`host_json` turns the
samples of a case's repetitions into the result's ``host`` object, which
``compare`` reads (pytest_afd.report.noise).

The 1-minute load average lags a change of contention by a minute or more, so
each repetition also records what it actually got: its CPU share (CPU time over
wall time), the seconds tasks stalled waiting for a CPU during it
(``/proc/pressure/cpu``, Linux PSI) and the runnable tasks before and after
(``/proc/stat`` ``procs_running``). Compare judges contention by the CPU share.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_afd.core.absent import absent
from pytest_afd.core.backend import RunOutputs
from pytest_afd.faults import perf as perf_fault

LOAD_WINDOWS_S = (60, 300, 900)  # what os.getloadavg() averages over
# AFD process steps carry step["afd"]["cpu_time_s"]: rank name -> CPU seconds of the step
# (pytest_afd.backends.cpu.afd.step_evidence); in-process steps have no "afd" entry.
STEP_AFD_KEY = "afd"
STEP_CPU_KEY = "cpu_time_s"


@dataclass(frozen=True)
class HostSample:
    """One repetition's host conditions and its wall and CPU time."""

    wall_time_s: float
    # This process's CPU time (all threads) plus every AFD rank's, when ranks are processes.
    cpu_time_s: float
    process_cpu_time_s: float
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    # AFD process ranks: rank name -> CPU seconds of the run; None for in-process backends.
    rank_cpu_time_s: Mapping[str, float] | None = None
    # Seconds some task waited for a CPU during the run (PSI), or absent(...) saying why.
    cpu_pressure_some_s: float | Mapping[str, Any] | None = None
    # Runnable tasks (procs_running) before and after, or absent(...) saying why.
    runnable: tuple[int, int] | Mapping[str, Any] | None = None

    @property
    def cpu_share(self) -> float:
        """CPU time over wall time: the CPU this repetition got (0 for a zero wall time)."""
        return self.cpu_time_s / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"cpu_share": self.cpu_share}
        if self.cpu_pressure_some_s is not None:
            extra["cpu_pressure_some_s"] = self.cpu_pressure_some_s
        if self.runnable is not None:
            extra["runnable"] = (list(self.runnable) if isinstance(self.runnable, tuple)
                                 else self.runnable)
        return {
            **extra,
            "wall_time_s": self.wall_time_s,
            "cpu_time_s": self.cpu_time_s,
            "process_cpu_time_s": self.process_cpu_time_s,
            "load_before": list(self.load_before),
            "load_after": list(self.load_after),
            "rank_cpu_time_s": None if self.rank_cpu_time_s is None else dict(self.rank_cpu_time_s),
        }


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask, not the machine's total)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def load_average() -> tuple[float, float, float]:
    one, five, fifteen = os.getloadavg()
    return float(one), float(five), float(fifteen)


PRESSURE_FILE = Path("/proc/pressure/cpu")
STAT_FILE = Path("/proc/stat")
MICROSECONDS = 1e6


def cpu_pressure_total_s(path: Path = PRESSURE_FILE) -> float | dict[str, Any]:
    """The PSI ``some`` stall total in seconds, or absent(...) naming why it is unknown."""
    try:
        text = path.read_text()
    except OSError as exc:
        return absent(f"{path} unreadable ({exc.strerror or exc}): no PSI on this kernel")
    for line in text.splitlines():
        kind, _, fields = line.partition(" ")
        if kind == "some":
            for field_text in fields.split():
                name, _, value = field_text.partition("=")
                if name == "total" and value.isdigit():
                    return int(value) / MICROSECONDS
    return absent(f"{path} has no 'some ... total=' line")


def runnable_tasks(path: Path = STAT_FILE) -> int | dict[str, Any]:
    """``procs_running`` of ``/proc/stat`` (this sampler included), or absent(...)."""
    try:
        text = path.read_text()
    except OSError as exc:
        return absent(f"{path} unreadable ({exc.strerror or exc})")
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "procs_running" and value.strip().isdigit():
            return int(value)
    return absent(f"{path} has no procs_running line")


def _pressure_delta(before: float | dict[str, Any], after: float | dict[str, Any]
                    ) -> float | dict[str, Any]:
    if isinstance(before, dict):
        return before
    if isinstance(after, dict):
        return after
    return max(after - before, 0.0)


def _runnable(before: int | dict[str, Any], after: int | dict[str, Any]
              ) -> tuple[int, int] | dict[str, Any]:
    for value in (before, after):
        if isinstance(value, dict):
            return value
    return before, after  # type: ignore[return-value]


def rank_cpu_times(outputs: RunOutputs) -> dict[str, float] | None:
    """Per rank, CPU seconds summed over the run's steps; None when no step records them."""
    totals: dict[str, float] = {}
    for step in outputs.steps:
        if STEP_AFD_KEY not in step:
            continue
        for rank, seconds in step[STEP_AFD_KEY][STEP_CPU_KEY].items():
            totals[rank] = totals.get(rank, 0.0) + float(seconds)
    return totals or None


def measured_run(run: Callable[[], RunOutputs]) -> RunOutputs:
    """Run once and attach the host sample (``outputs.host``).

    The backend's own ``wall_time_s`` stays the headline's clock; the sample's
    wall time is the whole call as the host saw it. An active perf fault
    (:mod:`pytest_afd.faults.perf`) adds extra CPU work in proportion to the run's
    own (this process's and its AFD ranks') inside the measured span, and extends
    the backend's wall time by what that took.
    """
    load_before = load_average()
    pressure_before, runnable_before = cpu_pressure_total_s(), runnable_tasks()
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    outputs = run()
    ranks = rank_cpu_times(outputs)
    fault = perf_fault.fault_from_env()
    if fault is not None:  # extra work in proportion to the run's own CPU work
        run_cpu = time.process_time() - cpu_start + (sum(ranks.values()) if ranks else 0.0)
        fault.slow_down(outputs, run_cpu)
    process_cpu = time.process_time() - cpu_start
    wall = time.perf_counter() - wall_start
    outputs.host = HostSample(
        wall_time_s=wall,
        cpu_time_s=process_cpu + (sum(ranks.values()) if ranks else 0.0),
        process_cpu_time_s=process_cpu,
        load_before=load_before,
        load_after=load_average(),
        rank_cpu_time_s=ranks,
        cpu_pressure_some_s=_pressure_delta(pressure_before, cpu_pressure_total_s()),
        runnable=_runnable(runnable_before, runnable_tasks()),
    )
    return outputs


def host_json(samples: Sequence[HostSample], *, cpus: int | None = None) -> dict[str, Any]:
    """The result's ``host`` object: CPU count, load windows and every repetition's sample."""
    if not samples:
        raise ValueError("host_json() needs at least one repetition's sample")
    return {
        "cpu_count": cpus if cpus is not None else cpu_count(),
        "load_windows_s": list(LOAD_WINDOWS_S),
        "load_before": list(samples[0].load_before),
        "load_after": list(samples[-1].load_after),
        "repetitions": [sample.to_json() for sample in samples],
    }


def samples_of(runs: Sequence[RunOutputs]) -> list[HostSample] | None:
    """Every run's sample, or None when any run was not measured through :func:`measured_run`."""
    samples = [run.host for run in runs]
    return None if any(sample is None for sample in samples) else samples
