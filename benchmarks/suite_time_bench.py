"""The harness's own loop: ``pytest -m gate`` and the default run, timed with load and CPU time.

    python3 benchmarks/suite_time_bench.py [--gate-only] [--json] [--output out.json]

Issue 43's targets, at a 1-minute load below 1 on the 2-core host: ``pytest -m gate``
(serial) within 30 s and the default run (``python3 -m pytest -n 2 --dist worksteal``, as ``.ci/run``
runs it) within 3 minutes. A shared host is not always quiet, and wall time follows
the load, so each run also reports its CPU time (user + system of pytest and every
child it waited for) and is judged on it as well: 28 s for the gate, 330 s for the
default run (what the wall targets come to at load below 1, from the runs recorded
in docs/benchmarks.md). A wall target counts only when the run starts at a load below
1 (each run first waits up to 150 s for the previous one's load to decay; a loaded run
says so and is not met); the CPU targets are judged at any load.
``pytest -m gate -n 2 --dist worksteal`` is timed too, against the same 30 s, its CPU time reported only.

Each command runs once, from the repository root, with ``PYTHONPATH`` set to it (the
tree under test, not an installed copy). The test counts come from pytest's last line.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench_load import emit_report

REPO = Path(__file__).resolve().parents[1]
MAX_WALL_LOAD = 1.0
"""The issue's condition for the wall targets: a 1-minute load below 1 on 2 cores."""
SETTLE_MAX_S = 150.0
"""Longest wait for the load to decay before a run (from 2 to 1 takes ~42 s)."""
SETTLE_POLL_S = 2.0


@dataclass(frozen=True)
class SuiteTarget:
    name: str
    argv: tuple[str, ...]
    max_wall_s: float
    max_cpu_s: float | None
    """None: the CPU time is reported beside the wall time, not judged (no derived target)."""


GATE = SuiteTarget("gate", ("-m", "gate"), max_wall_s=30.0, max_cpu_s=28.0)
WORKSTEAL = ("-n", "2", "--dist", "worksteal")
"""Both cores, an idle worker taking queued tests from the busy one (README's command)."""
GATE_PARALLEL = SuiteTarget("gate_n2", ("-m", "gate", *WORKSTEAL), max_wall_s=30.0,
                            max_cpu_s=None)
"""The same gates on both cores (pytest-xdist, as CI's default run): what ``pytest -m gate
-n 2`` costs a developer; its CPU time includes the second worker's start-up."""
DEFAULT_RUN = SuiteTarget("default_run", WORKSTEAL, max_wall_s=180.0, max_cpu_s=330.0)
OUTCOME = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected)")


def counts(last_line: str) -> dict[str, int]:
    """``{"passed": 144, "skipped": 4, ...}`` from pytest's summary line."""
    return {kind.rstrip("s") if kind.startswith("error") else kind: int(number)
            for number, kind in OUTCOME.findall(last_line)}


def judge(target: SuiteTarget, *, wall_s: float, cpu_s: float, load_before: float,
          load_after: float, exit_status: int, max_wall_load: float = MAX_WALL_LOAD) -> list[dict]:
    """Two targets per run (wall at low load, CPU at any load); a failed run meets neither.

    The condition is the host's load when the run starts: a run's own processes raise the
    1-minute load it ends at (two xdist workers end near 2 on an idle host), so the load
    after is reported, not judged. ``settle`` lets the previous run's load decay first."""
    load = load_before
    quiet = load < max_wall_load
    passed = exit_status == 0
    wall = {"name": f"{target.name}_wall_s", "measured": round(wall_s, 1),
            "max": target.max_wall_s, "load_1m": round(load, 2), "max_load": max_wall_load,
            "load_ok": quiet, "met": passed and quiet and wall_s <= target.max_wall_s}
    if target.max_cpu_s is None:
        return [wall]
    return [wall, {"name": f"{target.name}_cpu_s", "measured": round(cpu_s, 1),
                   "max": target.max_cpu_s, "load_1m": round(load, 2),
                   "met": passed and cpu_s <= target.max_cpu_s}]


MAX_LISTED_FAILURES = 10


def failed_tests(stdout: str) -> list[str]:
    """The node ids of pytest's ``FAILED``/``ERROR`` summary lines (``-ra``), so a failed
    run says which tests failed, not only how many."""
    found = [line.split(" ", 1)[1].split(" - ", 1)[0] for line in stdout.splitlines()
             if line.startswith(("FAILED ", "ERROR "))]
    return found[:MAX_LISTED_FAILURES]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def settle(max_load: float = MAX_WALL_LOAD, max_wait_s: float = SETTLE_MAX_S,
           poll_s: float = SETTLE_POLL_S) -> float:
    """Wait (at most ``max_wait_s``) for the 1-minute load to fall below ``max_load``, so a
    run does not start on the load of the one before it; returns the seconds waited."""
    started = time.monotonic()
    while os.getloadavg()[0] >= max_load and time.monotonic() - started < max_wait_s:
        time.sleep(poll_s)
    return round(time.monotonic() - started, 1)


def run_suite(target: SuiteTarget) -> dict:
    """Run one command and return its figures (wall, CPU, load, counts, exit status)."""
    waited_s = settle()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *target.argv]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    load_before, cpu_before, started = os.getloadavg()[0], _children_cpu(), time.monotonic()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          check=False)
    wall, cpu, load_after = time.monotonic() - started, _children_cpu() - cpu_before, \
        os.getloadavg()[0]
    last = next((line for line in reversed(done.stdout.splitlines()) if line.strip()), "")
    failures = failed_tests(done.stdout)
    return {"command": " ".join(["python3", "-m", "pytest", *target.argv]),
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "settled_s": waited_s,
            "load_1m_before": load_before,
            "load_1m_after": load_after, "exit_status": done.returncode,
            "counts": counts(last), "last_line": last, "failed_tests": failures,
            "targets": judge(target, wall_s=wall, cpu_s=cpu, load_before=load_before,
                             load_after=load_after, exit_status=done.returncode)}


def summary(runs: dict[str, dict]) -> str:
    parts = []
    for name, run in runs.items():
        flags = ", ".join(f"{t['name']}={t['measured']:g}/{t['max']:g}"
                          f"{'' if t['met'] else '!'}" for t in run["targets"])
        parts.append(f"{name}: {flags} (CPU {run['cpu_s']:g} s, load "
                     f"{run['load_1m_before']:.2f} at the start, {run['load_1m_after']:.2f} at "
                     f"the end, {run['counts']})")
    met = sum(t["met"] for run in runs.values() for t in run["targets"])
    total = sum(len(run["targets"]) for run in runs.values())
    return f"suite_time: {met}/{total} targets met (! = not met) - " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gate-only", action="store_true", help="time pytest -m gate only")
    parser.add_argument("--json", action="store_true", help="the JSON report on stdout")
    parser.add_argument("--output", help="write the JSON report here")
    args = parser.parse_args(argv)
    suites = (GATE, GATE_PARALLEL) if args.gate_only else (GATE, GATE_PARALLEL, DEFAULT_RUN)
    runs = {target.name: run_suite(target) for target in suites}
    report = {"benchmark": "suite_time", "cpus": os.cpu_count(), "runs": runs,
              "targets": [t for run in runs.values() for t in run["targets"]]}
    emit_report(report, summary(runs), output=args.output, as_json=args.json)
    return 0 if all(run["exit_status"] == 0 for run in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
