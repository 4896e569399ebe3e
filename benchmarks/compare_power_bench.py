"""compare on a busy host: no call on an A/A pair, "worse" on a planted 1.5x slowdown.

Issue 40 finding 3, as the issue ran it: three busy processes beside the
harness (``python -c 'while True: pass'``, each bounded by ``--busy-limit-s``
and killed at the end), then three ``pytest -m stage_d`` sessions of the same
code through the real harness into three results directories:

* ``a1`` and ``a2``: the same code (the A/A pair);
* ``b``: every measured run 1.5x slower (``PYTEST_AFD_PERF_FAULT=slowdown:0.5``,
  pytest_afd.faults.perf: each run spins 0.5x its own CPU seconds in extra CPU work).

Then ``python -m pytest_afd compare`` on ``a1 a2`` and on ``a1 b``. Targets:
the A/A pair makes no call (no stage-wide and no per-case "B better"/"B worse"),
the 1.5x pair is called "B worse" stage-wide on prefill tokens/s. The JSON
(``--json``) has one ``met`` flag per target, each session's wall and CPU
time, the load averages and the compare verdict lines; one summary line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUSY_PROCESSES = 3
DEFAULT_BUSY_LIMIT_S = 900
PLANTED_FAULT = "slowdown:0.5"  # every measured run 1.5x slower
SESSION_TIMEOUT_S = 900
DEFAULT_SCALE = "1/256"  # small scale: three sessions fit in ~10 min on a busy 2-CPU host
COMPARE_TIMEOUT_S = 300
CALLS = ("B better", "B worse")
THROUGHPUT = "prefill tokens/s"
BUSY_SCRIPT = "import time\nend = time.monotonic() + {limit}\nwhile time.monotonic() < end:\n    pass\n"


def start_busy(count: int, limit_s: float) -> list[subprocess.Popen]:
    """``count`` CPU-bound processes, each ending by itself after ``limit_s``."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_SCRIPT.format(limit=limit_s)])
            for _ in range(count)]


def stop_busy(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
    for process in processes:
        process.wait()


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_session(results_dir: Path, fault: str | None, extra: list[str]) -> dict:
    """One ``pytest -m stage_d`` session; wall and CPU seconds, load before and after."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                     os.environ.get("PYTHONPATH")]))}
    env.pop("PYTEST_AFD_PERF_FAULT", None)
    if fault:
        env["PYTEST_AFD_PERF_FAULT"] = fault
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               "-m", "stage_d", "--afd-results-dir", str(results_dir), *extra,
               str(ROOT / "suites" / "stage_d")]
    load_before, cpu_before, started = os.getloadavg(), children_cpu_s(), time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=SESSION_TIMEOUT_S, check=False)
        code, stdout = done.returncode, done.stdout
    except subprocess.TimeoutExpired as expired:  # recorded, not fatal: compare what it wrote
        code, stdout = f"timed out after {SESSION_TIMEOUT_S} s", str(expired.stdout or "")
    return {
        "results_dir": str(results_dir), "fault": fault, "exit_code": code,
        "wall_s": time.perf_counter() - started, "cpu_s": children_cpu_s() - cpu_before,
        "load_before": list(load_before), "load_after": list(os.getloadavg()),
        "tail": stdout.splitlines()[-3:],
    }


def run_compare(a: Path, b: Path, output: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "pytest_afd", "compare", str(a), str(b),
                           "--output", str(output), "--no-calibration"],
                          cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=COMPARE_TIMEOUT_S, check=False)
    lines = done.stdout.splitlines()
    stage = [line for line in lines if line.startswith("stage_")]
    per_case = [line.strip() for line in lines if line.startswith("  ")]
    return {"exit_code": done.returncode, "verdict": lines[0] if lines else done.stderr,
            "stage_calls": stage, "per_case_calls": per_case, "stderr": done.stderr[-2000:]}


def _called(compare: dict, metric: str | None = None) -> list[str]:
    rows = compare["stage_calls"] + compare["per_case_calls"]
    return [row for row in rows if any(call in row for call in CALLS)
            and (metric is None or metric in row)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--busy-limit-s", type=float, default=DEFAULT_BUSY_LIMIT_S)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--scale", default=DEFAULT_SCALE, help="--afd-stage-scale of the sessions")
    parser.add_argument("--warmups", type=int, default=0)
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="afd-compare-power-"))
    extra = ["--afd-repeats", str(args.repeats), "--afd-stage-scale", args.scale,
             "--afd-warmups", str(args.warmups)]
    busy = start_busy(BUSY_PROCESSES, args.busy_limit_s)
    started = time.perf_counter()
    try:
        sessions = {name: run_session(work / name, fault, extra)
                    for name, fault in (("a1", None), ("b", PLANTED_FAULT), ("a2", None))}
    finally:
        stop_busy(busy)
    a_a = run_compare(work / "a1", work / "a2", work / "compare-a1-a2")
    a_b = run_compare(work / "a1", work / "b", work / "compare-a1-b")
    worse = [row for row in a_b["stage_calls"] if THROUGHPUT in row and "B worse" in row]
    targets = {
        "a_a_no_call": {"met": all(s["exit_code"] == 0 for s in sessions.values())
                        and a_a["exit_code"] == 0 and not _called(a_a),
                        "calls": _called(a_a)},
        "slowdown_1_5x_called_worse": {"met": a_b["exit_code"] == 0 and bool(worse),
                                       "rows": worse},
    }
    doc = {
        "benchmark": "compare_power_bench",
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(),
                 "busy_processes": BUSY_PROCESSES},
        "planted_fault": PLANTED_FAULT, "repeats": args.repeats, "scale": args.scale,
        "warmups": args.warmups,
        "total_wall_s": time.perf_counter() - started,
        "sessions": sessions, "compare_a_a": a_a, "compare_a_b": a_b, "targets": targets,
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    loads = ", ".join(f"{name} load {s['load_before'][0]:.1f}->{s['load_after'][0]:.1f} "
                      f"{s['wall_s']:.0f}s wall {s['cpu_s']:.0f}s CPU"
                      for name, s in sessions.items())
    print(f"compare_power_bench: A/A no call met={targets['a_a_no_call']['met']}; "
          f"1.5x worse met={targets['slowdown_1_5x_called_worse']['met']}; {loads}; "
          f"A/A: {a_a['verdict']}; A/B: {a_b['verdict']}")
    return 0 if all(t["met"] for t in targets.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
