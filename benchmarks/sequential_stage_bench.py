"""Sequential against fixed repetitions on the CPU backend's stages (issue 43 item 3).

    python3 benchmarks/sequential_stage_bench.py [--fixed-repeats 12] [--nodes NODEID ...]
        [--output out.json]

Runs the selected stage cases (default: Stages A-D at their smallest size) twice in
fresh pytest sessions, once with fixed repetitions (``--afd-repeats``; default 12,
the fixed n that ``sequential_sim_bench`` finds reaches the sequential rule's power at
a 1.2x change on this harness's CPU noise) and once with ``--afd-sequential``
(first look 3, at most 16), and reports side by side:

* the measured repetitions (every case's count, summed) and each session's wall and
  child CPU time, with the load before and after;
* per comparison the sequential run recorded (``protocol.sequential``): its verdict,
  and the fixed run's verdict on the same pair from a paired t-test at alpha 5%
  on its ``--fixed-repeats`` log-ratios (``higher``/``lower``/``undecided``).

Targets (``met`` flags): the same verdicts wherever the sequential rule decided, and
at least 2x fewer measured repetitions. One summary line on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scipy import stats as scipy_stats

REPO = Path(__file__).resolve().parents[1]
DEFAULT_NODES = (
    "suites/stage_a/test_stage_a_policies.py::test_stage_a_policy_matrix[smallest]",
    "suites/stage_b/test_stage_b_prefix_cache.py::test_stage_b_hit_ratio_sweep",
    "suites/stage_c/test_stage_c_distributions.py::test_stage_c_distribution_matrix",
    "suites/stage_d/test_stage_d_chunking.py::test_stage_d_chunk_sweep_then_best_two",
)
DEFAULT_FIXED_REPEATS = 12
MIN_SAVING = 2.0
ALPHA = 0.05
METRIC = "wall_time_s"


def run_session(nodes, results_dir: Path, extra: list[str], timeout_s: float) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load_before = os.getloadavg()
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *nodes,
         "-m", "stage_a or stage_b or stage_c or stage_d",
         "--afd-results-dir", str(results_dir), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"args": extra, "returncode": completed.returncode, "wall_s": round(wall, 1),
            "child_cpu_s": round(after.ru_utime - before.ru_utime
                                 + after.ru_stime - before.ru_stime, 1),
            "load_before": load_before, "load_after": os.getloadavg(),
            "tail": completed.stdout[-1500:] + completed.stderr[-500:]}


def read_results(results_dir: Path) -> dict[str, dict]:
    """Result documents by case id (stage results only)."""
    docs = {}
    for path in results_dir.glob("*.json"):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and "case_id" in doc and METRIC in doc.get("metrics", {}):
            docs[doc["case_id"]] = doc
    return docs


def fixed_verdict(a: list[float], b: list[float]) -> str:
    """The fixed protocol's call on ``b / a``: a paired t-test at ``ALPHA`` on log-ratios."""
    ratios = [math.log(y / x) for x, y in zip(a, b, strict=False)]
    n = len(ratios)
    mean = sum(ratios) / n
    sd = math.sqrt(sum((r - mean) ** 2 for r in ratios) / (n - 1))
    if sd == 0:
        return "undecided"
    t = mean / (sd / math.sqrt(n))
    if abs(t) <= scipy_stats.t.ppf(1 - ALPHA / 2, n - 1):
        return "undecided"
    return "higher" if t > 0 else "lower"


def node_of(case_id: str, nodes) -> str:
    return next((node for node in nodes if case_id.startswith(node + "/")), "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed-repeats", type=int, default=DEFAULT_FIXED_REPEATS)
    parser.add_argument("--nodes", nargs="+", default=list(DEFAULT_NODES))
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.fixed_repeats < 3:
        parser.error(f"--fixed-repeats={args.fixed_repeats} must be >= 3")
    work = Path(tempfile.mkdtemp(prefix="sequential-stage-bench-"))
    sessions = {
        "fixed": run_session(args.nodes, work / "fixed",
                             ["--afd-repeats", str(args.fixed_repeats)], args.timeout_s),
        "sequential": run_session(args.nodes, work / "sequential", ["--afd-sequential"],
                                  args.timeout_s),
    }
    docs = {mode: read_results(work / mode) for mode in sessions}
    reps = {mode: sum(len(d["metrics"][METRIC]["repetitions"]) for d in found.values())
            for mode, found in docs.items()}
    rows = []
    for case_id, doc in docs["sequential"].items():
        node = node_of(case_id, args.nodes)
        for entry in doc["protocol"].get("sequential", {}).get("comparisons", []):
            a_id, b_id = f"{node}/{entry['a']}", f"{node}/{entry['b']}"
            if case_id != b_id:  # each comparison once, from its second case
                continue
            row = {"a": a_id, "b": b_id, "sequential_verdict": entry["verdict"],
                   "sequential_stopped": entry["stopped"],
                   "sequential_repetitions": entry["repetitions"]}
            if a_id in docs["fixed"] and b_id in docs["fixed"]:
                row["fixed_verdict"] = fixed_verdict(
                    docs["fixed"][a_id]["metrics"][METRIC]["repetitions"],
                    docs["fixed"][b_id]["metrics"][METRIC]["repetitions"])
            rows.append(row)
    decided = [r for r in rows if r["sequential_verdict"] in ("higher", "lower")]
    same = [r for r in decided if r.get("fixed_verdict") == r["sequential_verdict"]]
    saving = reps["fixed"] / reps["sequential"] if reps["sequential"] else None
    report = {
        "benchmark": "sequential_stage_bench", "nodes": args.nodes,
        "fixed_repeats": args.fixed_repeats, "sessions": sessions,
        "measured_repetitions": reps, "cases": {m: len(d) for m, d in docs.items()},
        "comparisons": rows,
        "targets": {
            "same_verdicts_where_sequential_decided": {
                "decided": len(decided), "same": len(same),
                "met": bool(decided) and len(same) == len(decided)},
            "two_x_fewer_repetitions": {"min_ratio": MIN_SAVING, "measured_ratio": saving,
                                        "met": saving is not None and saving >= MIN_SAVING},
        },
        "results_dirs": str(work),
    }
    text = json.dumps(report, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    t = report["targets"]
    print(f"sequential_stage_bench: repetitions fixed {reps['fixed']} vs sequential "
          f"{reps['sequential']} (x{saving if saving is None else round(saving, 2)}"
          f"{'' if t['two_x_fewer_repetitions']['met'] else '!'}), wall "
          f"{sessions['fixed']['wall_s']} s vs {sessions['sequential']['wall_s']} s, child CPU "
          f"{sessions['fixed']['child_cpu_s']} s vs {sessions['sequential']['child_cpu_s']} s; "
          f"verdicts: {len(same)}/{len(decided)} decided comparisons the same"
          f"{'' if t['same_verdicts_where_sequential_decided']['met'] else '!'} "
          f"(rc {sessions['fixed']['returncode']}/{sessions['sequential']['returncode']}; "
          f"load {sessions['fixed']['load_before'][0]:.1f}->"
          f"{sessions['sequential']['load_after'][0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
