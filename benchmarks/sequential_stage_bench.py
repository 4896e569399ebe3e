"""Sequential against fixed repetitions on the CPU backend's stages (issue 43 item 3).

    python3 benchmarks/sequential_stage_bench.py [--fixed-repeats 11] [--nodes NODEID ...]
        [--output out.json] [--results-dirs DIR]

Runs the selected stage cases (default: Stages A-D at their smallest size) twice in
fresh pytest sessions, once with fixed repetitions (``--afd-repeats``; default 11,
the fixed n that ``sequential_sim_bench`` finds reaches the sequential rule's power at
a 1.2x change on this harness's CPU noise: the fixed protocol at equal error rates)
and once with ``--afd-sequential`` (first look 3, at most 16), and reports side by side:

* the measured repetitions (every case's count, summed) and each session's wall and
  child CPU time, with the load before and after;
* per comparison the sequential run recorded (``protocol.sequential``): its verdict,
  and the fixed run's verdict on the same pair from a paired t-test at alpha 5%
  on its ``--fixed-repeats`` log-ratios (``higher``/``lower``/``undecided``), and the
  verdict table of the two (a call agrees with the same call; ``equivalent`` and
  ``undecided`` agree with the fixed test's no call);
* the same rule replayed on the fixed session's own paired repetitions (its maximum
  capped at ``--fixed-repeats``): the verdicts and repetitions it would have used on
  the same data, which separates the rule from the two sessions' different noise.

Targets (``met`` flags): the same verdicts wherever the sequential rule decided, no
opposite call, and at least 2x fewer measured repetitions. One summary line on stdout.
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

from pytest_afd.stats.sequential import SequentialDesign, decide_sequence

REPO = Path(__file__).resolve().parents[1]
DEFAULT_NODES = (
    "suites/stage_a/test_stage_a_policies.py::test_stage_a_policy_matrix[smallest]",
    "suites/stage_b/test_stage_b_prefix_cache.py::test_stage_b_hit_ratio_sweep",
    "suites/stage_c/test_stage_c_distributions.py::test_stage_c_distribution_matrix",
    "suites/stage_d/test_stage_d_chunking.py::test_stage_d_chunk_sweep_then_best_two",
)
DEFAULT_FIXED_REPEATS = 11
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


def _log_ratio_moments(a: list[float], b: list[float]) -> tuple[int, float, float]:
    """(n, mean, sd) of the paired log-ratios ``log(b / a)``."""
    ratios = [math.log(y / x) for x, y in zip(a, b, strict=False)]
    n = len(ratios)
    mean = sum(ratios) / n
    return n, mean, math.sqrt(sum((r - mean) ** 2 for r in ratios) / (n - 1))


def fixed_verdict(a: list[float], b: list[float]) -> str:
    """The fixed protocol's call on ``b / a``: a paired t-test at ``ALPHA`` on log-ratios."""
    n, mean, sd = _log_ratio_moments(a, b)
    if sd == 0:
        return "undecided"
    t = mean / (sd / math.sqrt(n))
    if abs(t) <= scipy_stats.t.ppf(1 - ALPHA / 2, n - 1):
        return "undecided"
    return "higher" if t > 0 else "lower"


def fixed_interval(a: list[float], b: list[float]) -> dict:
    """``b / a`` from the fixed session: the geometric-mean ratio and its 95% t interval,
    so a verdict that differs can be read against the size of the difference."""
    n, mean, sd = _log_ratio_moments(a, b)
    half = scipy_stats.t.ppf(1 - ALPHA / 2, n - 1) * sd / math.sqrt(n)
    return {"ratio": round(math.exp(mean), 4),
            "interval_95": [round(math.exp(mean - half), 4), round(math.exp(mean + half), 4)]}


CALLS = ("higher", "lower")


def agreement(sequential: str, fixed: str | None) -> str:
    """``same``, ``opposite``, ``sequential_only`` (a call the fixed test did not make),
    ``fixed_only``, or ``no_fixed`` (the fixed session has no such pair)."""
    if fixed is None:
        return "no_fixed"
    seq_call, fixed_call = sequential in CALLS, fixed in CALLS
    if seq_call and fixed_call:
        return "same" if sequential == fixed else "opposite"
    if seq_call or fixed_call:
        return "sequential_only" if seq_call else "fixed_only"
    return "same"


def replay(fixed_docs: dict[str, dict], rows: list[dict], fixed_repeats: int) -> dict:
    """The sequential rule on the fixed session's repetitions, maximum capped at
    ``fixed_repeats``: verdicts per comparison and repetitions per case (a case measures
    until its last comparison stops; one in no comparison gets the first look)."""
    design = SequentialDesign(max_repetitions=fixed_repeats)
    counts = {case_id: design.min_repetitions for case_id in fixed_docs}
    verdicts = {}
    for row in rows:
        if row["a"] not in fixed_docs or row["b"] not in fixed_docs:
            continue
        a = fixed_docs[row["a"]]["metrics"][METRIC]["repetitions"]
        b = fixed_docs[row["b"]]["metrics"][METRIC]["repetitions"]
        decision = decide_sequence(design, [math.log(y / x) for x, y in zip(a, b, strict=False)])
        verdicts[(row["a"], row["b"])] = decision
        for case_id in (row["a"], row["b"]):
            counts[case_id] = max(counts[case_id], decision.repetitions)
    return {"design": design.to_json(), "repetitions": sum(counts.values()),
            "verdicts": verdicts}


def node_of(case_id: str, nodes) -> str:
    return next((node for node in nodes if case_id.startswith(node + "/")), "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixed-repeats", type=int, default=DEFAULT_FIXED_REPEATS)
    parser.add_argument("--nodes", nargs="+", default=list(DEFAULT_NODES))
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--results-dirs", type=Path,
                        help="analyse an earlier run's fixed/ and sequential/ results again "
                             "(no sessions: wall and CPU times are not measured)")
    args = parser.parse_args(argv)
    if args.fixed_repeats < 3:
        parser.error(f"--fixed-repeats={args.fixed_repeats} must be >= 3")
    if args.results_dirs is not None:
        work = args.results_dirs
        missing = [m for m in ("fixed", "sequential") if not (work / m).is_dir()]
        if missing:
            parser.error(f"--results-dirs={str(work)!r} has no {missing} folder")
        sessions = {mode: {"args": "not run (--results-dirs)", "returncode": None,
                           "wall_s": None, "child_cpu_s": None,
                           "load_before": [math.nan] * 3, "load_after": [math.nan] * 3}
                    for mode in ("fixed", "sequential")}
    else:
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
                fixed_a = docs["fixed"][a_id]["metrics"][METRIC]["repetitions"]
                fixed_b = docs["fixed"][b_id]["metrics"][METRIC]["repetitions"]
                row["fixed_verdict"] = fixed_verdict(fixed_a, fixed_b)
                row["fixed_b_over_a"] = fixed_interval(fixed_a, fixed_b)
            rows.append(row)
    replayed = replay(docs["fixed"], rows, args.fixed_repeats)
    for row in rows:
        row["agreement"] = agreement(row["sequential_verdict"], row.get("fixed_verdict"))
        decision = replayed["verdicts"].get((row["a"], row["b"]))
        if decision is not None:
            row["replay_verdict"], row["replay_repetitions"] = (decision.verdict,
                                                                decision.repetitions)
            row["replay_agreement"] = agreement(decision.verdict, row.get("fixed_verdict"))
    table = {}
    for row in rows:
        key = f"{row['sequential_verdict']}/{row.get('fixed_verdict')}"
        table[key] = table.get(key, 0) + 1
    tally = {kind: sum(r["agreement"] == kind for r in rows) for kind in
             ("same", "opposite", "sequential_only", "fixed_only", "no_fixed")}
    replay_tally = {kind: sum(r.get("replay_agreement") == kind for r in rows) for kind in
                    ("same", "opposite", "sequential_only", "fixed_only")}
    decided = [r for r in rows if r["sequential_verdict"] in CALLS]
    same = [r for r in decided if r.get("fixed_verdict") == r["sequential_verdict"]]
    saving = reps["fixed"] / reps["sequential"] if reps["sequential"] else None
    replay_saving = (reps["fixed"] / replayed["repetitions"]
                     if replayed["repetitions"] else None)
    report = {
        "benchmark": "sequential_stage_bench", "nodes": args.nodes,
        "fixed_repeats": args.fixed_repeats, "sessions": sessions,
        "measured_repetitions": reps, "cases": {m: len(d) for m, d in docs.items()},
        "comparisons": rows,
        "verdict_table_sequential_over_fixed": table,
        "agreement": tally,
        "replay_on_fixed_data": {"design": replayed["design"],
                                 "measured_repetitions": replayed["repetitions"],
                                 "fixed_over_replay": replay_saving,
                                 "agreement": replay_tally},
        "targets": {
            "same_verdicts_where_sequential_decided": {
                "decided": len(decided), "same": len(same),
                "met": bool(decided) and len(same) == len(decided)},
            "no_opposite_call": {"opposite": tally["opposite"],
                                 "met": tally["opposite"] == 0},
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
          f"{'' if t['same_verdicts_where_sequential_decided']['met'] else '!'}, "
          f"{tally['same']}/{len(rows)} agree, {tally['opposite']} opposite; replayed on the "
          f"fixed data: {replayed['repetitions']} repetitions "
          f"(x{replay_saving if replay_saving is None else round(replay_saving, 2)}), "
          f"{replay_tally['same']}/{len(rows)} agree "
          f"(rc {sessions['fixed']['returncode']}/{sessions['sequential']['returncode']}; "
          f"load {sessions['fixed']['load_before'][0]:.1f}->"
          f"{sessions['sequential']['load_after'][0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
