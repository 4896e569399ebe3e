"""--afd-ab-checkout on a busy host: no call on two identical checkouts, "B slower" on a planted
1.5x slowdown in one code version.

Issue 40: two sessions of two code versions could not be compared on a busy
2-CPU host, and the interleaved ``--afd-ab`` took only option sets. Here the
code versions are three copies of this checkout under a temp dir:

* ``A`` and ``A2``: identical (the A/A pair);
* ``B``: the same code with a planted change: its CPU backend's ``run`` does
  1.5x the CPU work (``pytest_afd.faults.perf.Slowdown(0.5)`` after each run, in
  proportion to the run's own CPU seconds, as the perf fault does): a slower
  *code version*, served by B's own CPU server, not a fault the harness applies.

Beside three busy processes (``compare_power_bench.start_busy``), two real
sessions: ``pytest -m <stage> --afd-ab-checkout A A2`` and ``... A B``. Each
alternates A and B per repetition; the verdict's interleaved A/B line
(:func:`pytest_afd.stats.conclusions.ab_text`, read back from the results)
is the call. Targets, one ``met`` flag each: the A/A pair says "no
difference"; the A/B pair says "B slower"; every result's ``evidence.ab_side``
shows the serving CPU server imported its own side's checkout. The JSON has
each session's wall and CPU seconds (this process is a child subreaper, so the
side servers' CPU time is counted once they exit) and the load averages.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compare_power_bench import BUSY_PROCESSES, children_cpu_s, start_busy, stop_busy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pytest_afd.stats.conclusions import ab_text  # noqa: E402  (after the repository root)

PACKAGES = ("pytest_afd", "afd_split", "schemas")
PLANTED_FILE = Path("pytest_afd") / "backends" / "cpu" / "backend.py"
PLANTED_EXTRA = 0.5  # 1.5x the CPU work per run
PLANTED = f'''

# --- planted by benchmarks/ab_code_versions_bench.py: this code version is slower -------------
def _planted_slowdown(run):
    import functools
    import time

    from pytest_afd.faults.perf import Slowdown
    from pytest_afd.stats.host import rank_cpu_times

    @functools.wraps(run)
    def slowed(self, prompts, settings):
        started = time.process_time()
        outputs = run(self, prompts, settings)
        ranks = rank_cpu_times(outputs) or {{}}
        Slowdown({PLANTED_EXTRA}).slow_down(outputs, time.process_time() - started + sum(ranks.values()))
        return outputs

    return slowed


CpuBackend.run = _planted_slowdown(CpuBackend.run)
'''
SESSION_TIMEOUT_S = 1800
# Stage A's smallest matrix: 12 cases on 3 server settings (3 CPU servers per side). Stage D
# would keep one server per chunk size and phase up on each side at once: memory a shared
# host may not have (--stage stage_d --keyword "" runs it).
DEFAULT_STAGE = "stage_a"
DEFAULT_KEYWORD = "smallest"
DEFAULT_SCALE = "1/256"
PR_SET_CHILD_SUBREAPER = 36
NO_CALL, SLOWER = "no difference", "B slower"


def checkout(target: Path, planted: bool = False) -> Path:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))
    if planted:
        path = target / PLANTED_FILE
        assert "class CpuBackend" in path.read_text(), f"{PLANTED_FILE} has no CpuBackend to slow"
        path.write_text(path.read_text() + PLANTED)
    return target


def become_subreaper() -> bool:
    """Adopt orphaned descendants (the side servers outlive ``deploy-cpu up``), so their CPU
    time reaches this process's RUSAGE_CHILDREN once they exit and are reaped."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run_session(work: Path, name: str, a: Path, b: Path, stage: str, extra: list[str]) -> dict:
    results = work / name
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AFD_CPU_DEPLOY_DIR": str(work / "state")}
    for variable in ("PYTEST_AFD_PERF_FAULT", "PYTEST_AFD_FAULT", "AFD_EVIDENCE_DIR"):
        env.pop(variable, None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               "-m", stage, str(ROOT / "suites" / stage), "--afd-results-dir", str(results),
               *extra, "--afd-ab-checkout", str(a), str(b)]
    load_before, cpu_before, started = os.getloadavg(), children_cpu_s(), time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=SESSION_TIMEOUT_S, check=False)
        code, stdout = done.returncode, done.stdout
    except subprocess.TimeoutExpired as expired:
        code, stdout = f"timed out after {SESSION_TIMEOUT_S} s", str(expired.stdout or "")
    time.sleep(1.0)
    reap()
    docs = [json.loads(path.read_text()) for path in results.rglob("*.json")]
    docs = [doc for doc in docs if isinstance(doc, dict) and doc.get("kind") == "afd-result"]
    own_code = all(doc["evidence"]["ab_side"]["served"]["code"]["pytest_afd"]
                   == str((a if doc["case_id"].endswith("ab-A") else b) / "pytest_afd")
                   for doc in docs if "ab_side" in doc["evidence"])
    return {
        "checkouts": [str(a), str(b)], "exit_code": code, "ab_line": ab_text(docs),
        "ab_results": sum("ab_side" in doc["evidence"] for doc in docs),
        "each_side_ran_its_own_code": own_code,
        "servers_left": len(list((work / "state").glob("*.json"))),
        "wall_s": time.perf_counter() - started, "cpu_s": children_cpu_s() - cpu_before,
        "load_before": list(load_before), "load_after": list(os.getloadavg()),
        "tail": stdout.splitlines()[-3:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", "--output", dest="json", type=Path, default=None,
                        help="write the figures here (pytest-afd bench --record passes --output)")
    parser.add_argument("--busy-limit-s", type=float, default=SESSION_TIMEOUT_S * 2)
    parser.add_argument("--stage", default=DEFAULT_STAGE)
    parser.add_argument("--keyword", default=DEFAULT_KEYWORD, help="pytest -k of the sessions")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmups", type=int, default=0)
    parser.add_argument("--scale", default=DEFAULT_SCALE)
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="afd-ab-code-"))
    a, a2 = checkout(work / "A"), checkout(work / "A2")
    b = checkout(work / "B", planted=True)
    extra = ["--afd-repeats", str(args.repeats), "--afd-warmups", str(args.warmups),
             "--afd-stage-scale", args.scale, *(["-k", args.keyword] if args.keyword else [])]
    subreaper = become_subreaper()
    busy = start_busy(BUSY_PROCESSES, args.busy_limit_s)
    started = time.perf_counter()
    try:
        sessions = {"a_a": run_session(work, "a_a", a, a2, args.stage, extra),
                    "a_b": run_session(work, "a_b", a, b, args.stage, extra)}
    finally:
        stop_busy(busy)
    ran = {name: s["exit_code"] == 0 and s["ab_results"] > 0 and s["servers_left"] == 0
           for name, s in sessions.items()}
    targets = [
        {"name": "a_a_no_call", "line": sessions["a_a"]["ab_line"],
         "met": ran["a_a"] and sessions["a_a"]["ab_line"].endswith(NO_CALL)},
        {"name": "slowdown_1_5x_called_worse", "line": sessions["a_b"]["ab_line"],
         "met": ran["a_b"] and sessions["a_b"]["ab_line"].endswith(SLOWER)},
        {"name": "each_side_ran_its_own_code",
         "met": all(s["each_side_ran_its_own_code"] for s in sessions.values())},
    ]
    doc = {
        "benchmark": "ab_code_versions_bench",
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(),
                 "busy_processes": BUSY_PROCESSES, "servers_cpu_counted": subreaper},
        "planted": f"CpuBackend.run does {1 + PLANTED_EXTRA:g}x the CPU work in checkout B",
        "stage": args.stage, "keyword": args.keyword, "repeats": args.repeats,
        "warmups": args.warmups, "scale": args.scale, "work_dir": str(work),
        "total_wall_s": time.perf_counter() - started, "sessions": sessions, "targets": targets,
    }
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    loads = "; ".join(f"{name} load {s['load_before'][0]:.1f}->{s['load_after'][0]:.1f} "
                      f"{s['wall_s']:.0f}s wall {s['cpu_s']:.0f}s CPU: {s['ab_line']}"
                      for name, s in sessions.items())
    print("ab_code_versions_bench: " + ", ".join(f"{t['name']} met={t['met']}" for t in targets)
          + f"; {loads}")
    return 0 if all(t["met"] for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
