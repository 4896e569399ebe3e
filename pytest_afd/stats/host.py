"""Host conditions of a measurement: load averages around each repetition, CPU count, CPU time.

A slower host and slower code both lengthen wall time; only a record of the
host tells them apart. :func:`measured_run` wraps one backend run and attaches a
:class:`HostSample` (load averages before and after, wall time, this process's
CPU time and, for AFD processes, each rank's CPU time from the step evidence)
to its :class:`~pytest_afd.core.backend.RunOutputs`; :func:`host_json` turns the
samples of a case's repetitions into the result's ``host`` object, which
``compare`` reads (pytest_afd.report.noise).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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

    def to_json(self) -> dict[str, Any]:
        return {
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
    (:mod:`pytest_afd.faults.perf`) adds its extra work inside the measured span
    and scales the backend's wall time the same way.
    """
    load_before = load_average()
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    outputs = run()
    fault = perf_fault.fault_from_env()
    if fault is not None:
        fault.slow_down(outputs, time.perf_counter() - wall_start)
    process_cpu = time.process_time() - cpu_start
    wall = time.perf_counter() - wall_start
    ranks = rank_cpu_times(outputs)
    outputs.host = HostSample(
        wall_time_s=wall,
        cpu_time_s=process_cpu + (sum(ranks.values()) if ranks else 0.0),
        process_cpu_time_s=process_cpu,
        load_before=load_before,
        load_after=load_average(),
        rank_cpu_time_s=ranks,
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
