"""A seeded performance fault: a real slowdown of every measured run, to prove compare sees it.

The split-path faults (:mod:`pytest_afd.faults.registry`) break correctness; this one
only costs time. ``PYTEST_AFD_PERF_FAULT=slowdown:0.3`` makes each run measured
through :func:`pytest_afd.stats.host.measured_run` do 30 % more work: after the
backend returns, the process spins until it has used 0.3 x the CPU seconds the
run itself used (this process and its AFD ranks), and that wall time is added
to the run's wall time and to every request's TTFT (the spin is part of the
measured span). So the work is 1.3x at any contention: on a busy host the spin
gets the share of a CPU the run got and the wall time grows about 1.3x too.
(It used to spin 0.3 x the run's *elapsed* time, which on a host giving the run
5 % of a CPU was six times the run's own work, not 30 % more; issue 40.)

``compare`` must call B worse when B ran under the fault and A did not
(tests/report/test_compare_noise.py builds such a pair with :meth:`Slowdown.slowed`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace

from pytest_afd.core.backend import RunOutputs

PERF_FAULT_ENV = "PYTEST_AFD_PERF_FAULT"
SLOWDOWN = "slowdown"
SEPARATOR = ":"
MAX_EXTRA_FRACTION = 10.0


@dataclass(frozen=True)
class Slowdown:
    """Extra CPU-bound work of ``extra_fraction`` x each run's elapsed time."""

    extra_fraction: float

    def extra_seconds(self, elapsed_s: float) -> float:
        return self.extra_fraction * elapsed_s

    def slow_down(self, outputs: RunOutputs, work_s: float) -> None:
        """Spin until the process has used ``extra_fraction`` x ``work_s`` more CPU time (the
        run's own CPU seconds: real work, not a wait), then extend the run's wall time and
        TTFTs by the wall time that took."""
        target = time.process_time() + self.extra_seconds(work_s)
        started = time.perf_counter()
        while time.process_time() < target:
            pass
        extend(outputs, time.perf_counter() - started)

    def slowed(self, outputs: RunOutputs) -> RunOutputs:
        """A copy of ``outputs`` as the fault leaves it when the spin gets a whole CPU.

        Wall time, TTFTs and the host sample's wall and CPU time grow by the
        spin (``extra_fraction`` x wall time); the load it ran under is kept.
        """
        extra = self.extra_seconds(outputs.wall_time_s)
        copy = replace(outputs, requests=[replace(r) for r in outputs.requests])
        extend(copy, extra)
        if outputs.host is not None:
            copy.host = replace(
                outputs.host,
                wall_time_s=outputs.host.wall_time_s + extra,
                cpu_time_s=outputs.host.cpu_time_s + extra,
                process_cpu_time_s=outputs.host.process_cpu_time_s + extra,
            )
        return copy


def extend(outputs: RunOutputs, extra_s: float) -> None:
    """Add ``extra_s`` to the run's wall time and to every request's TTFT, in place."""
    outputs.wall_time_s += extra_s
    for request in outputs.requests:
        if request.ttft_s is not None:
            request.ttft_s += extra_s


def parse(text: str, source: str = PERF_FAULT_ENV) -> Slowdown:
    """``slowdown:FRACTION`` -> :class:`Slowdown`; ValueError naming ``source`` otherwise."""
    name, _, value = text.partition(SEPARATOR)
    if name != SLOWDOWN:
        raise ValueError(f"{source}={text!r}: unknown perf fault {name!r}; expected '{SLOWDOWN}:0.3'")
    try:
        fraction = float(value)
    except ValueError:
        raise ValueError(
            f"{source}={text!r}: {value!r} is not a number (the extra work, e.g. 0.3 for 30 %)"
        ) from None
    if not 0 < fraction <= MAX_EXTRA_FRACTION:
        raise ValueError(f"{source}={text!r}: expected 0 < fraction <= {MAX_EXTRA_FRACTION}")
    return Slowdown(fraction)


def fault_from_env() -> Slowdown | None:
    """The fault named by :data:`PERF_FAULT_ENV`, or None when it is unset or empty."""
    text = os.environ.get(PERF_FAULT_ENV, "").strip()
    return parse(text) if text else None
