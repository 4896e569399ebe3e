"""Sequential repetitions shown, not claimed: 1,000 simulated sessions from recorded noise.

    python3 benchmarks/sequential_sim_bench.py [--sessions 1000] [--json] [--output out.json]

Noise: ``benchmarks/data/sequential_noise_cpu.json``, every Stage A case's
per-repetition wall and CPU time as the harness recorded them (its provenance is
in the file). Per metric, each case's log-times minus their median are its
residuals; every ordered pair of cases gives the paired residual differences
of the same rounds (what a comparison's log-ratio is when nothing differs).
Both orders are pooled, so the pool is symmetric about 0. A simulated session
draws its log-ratios from that pool with replacement (i.i.d.: the recorded
drift between rounds is not kept).

Per metric, for the default design (``pytest_afd.stats.sequential.SequentialDesign``,
looks 3, 5, 8, 12, 16, equivalence margin 5%) and the same with the equivalence
margin at the smallest change worth finding (1.2x), 1,000 sessions each:

* A/A: the false-call rate (an interval excluding a ratio of 1) — target <= 5%;
* a planted 1.2x change (``+log 1.2`` on every log-ratio): the power (the change
  found, in its direction) — target >= 80%;
* the mean repetitions used, A/A and planted, against the fixed protocol at
  equal error rates: the smallest fixed ``n`` whose paired t-test (alpha 5%) on
  the same sessions finds the planted change at least as often as the
  sequential rule did; and against the default fixed 3;
* the study's mix (A/A, 1.2x and a clear 1.5x change, one third each): the fixed
  ``n`` over the sequential mean repetitions — goals > 1 and >= 2.

JSON: one ``met`` flag per target and design; one summary line on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import numpy as np
from bench_load import emit_report
from scipy import stats as scipy_stats

from pytest_afd.stats.sequential import (
    STOP_THRESHOLD,
    VERDICT_HIGHER,
    SequentialDesign,
    decide_sequence,
)

DATA = Path(__file__).resolve().parent / "data" / "sequential_noise_cpu.json"
SESSIONS = 1000
PLANTED_RATIO = 1.2
MAX_FALSE_CALLS = 0.05
MIN_POWER = 0.80
FIXED_ALPHA = 0.05
DEFAULT_FIXED_REPEATS = 3
"""``--afd-repeats``' default: the fixed protocol the headline runs use."""
LARGE_RATIO = 1.5
"""A clear change (the study's mix: no change, the smallest worth finding, a clear one)."""
MAX_FIXED_SEARCH = 200
METRICS = ("cpu_time_s", "wall_time_s")


def noise_pool(document: dict, metric: str) -> np.ndarray:
    """Paired residual log-ratios of every ordered pair of cases (symmetric about 0)."""
    residuals = []
    for values in document["cases"].values():
        logs = np.log(np.asarray(values[metric], dtype=np.float64))
        residuals.append(logs - np.median(logs))
    pool = [a - b for a, b in itertools.permutations(residuals, 2)]
    return np.concatenate(pool)


def sessions(pool: np.ndarray, count: int, length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).choice(pool, size=(count, length), replace=True)


def run_design(design: SequentialDesign, draws: np.ndarray, shift: float) -> dict:
    decisions = [decide_sequence(design, list(row + shift)) for row in draws]
    found = [d.reason == STOP_THRESHOLD for d in decisions]
    right = [d.reason == STOP_THRESHOLD and d.verdict == VERDICT_HIGHER for d in decisions]
    reasons = {}
    for d in decisions:
        reasons[d.reason] = reasons.get(d.reason, 0) + 1
    return {"calls": float(np.mean(found)), "right_direction": float(np.mean(right)),
            "mean_repetitions": float(np.mean([d.repetitions for d in decisions])),
            "stopped": reasons}


def fixed_power(draws: np.ndarray, shift: float, n: int) -> float:
    """Share of sessions whose first ``n`` log-ratios a two-sided paired t-test calls."""
    data = draws[:, :n] + shift
    sd = data.std(axis=1, ddof=1)
    t = np.divide(data.mean(axis=1), sd / math.sqrt(n), out=np.zeros(len(data)), where=sd > 0)
    return float(np.mean(np.abs(t) > scipy_stats.t.ppf(1 - FIXED_ALPHA / 2, n - 1)))


def fixed_at_equal_power(draws: np.ndarray, shift: float, power: float) -> dict:
    """The smallest fixed n reaching ``power`` on the same sessions, with its A/A rate."""
    for n in range(DEFAULT_FIXED_REPEATS, draws.shape[1] + 1):
        reached = fixed_power(draws, shift, n)
        if reached >= power:
            return {"n": n, "power": reached, "aa_false_calls": fixed_power(draws, 0.0, n)}
    return {"n": None, "note": f"no n <= {draws.shape[1]} reaches the sequential power"}


def bench_metric(document: dict, metric: str, count: int, seed: int) -> dict:
    pool = noise_pool(document, metric)
    shift = math.log(PLANTED_RATIO)
    draws = sessions(pool, count, MAX_FIXED_SEARCH, seed)
    designs = {"default": SequentialDesign(),
               "margin_1.2x": SequentialDesign(equivalence_margin=PLANTED_RATIO - 1)}
    rows = []
    for name, design in designs.items():
        aa = run_design(design, draws, 0.0)
        planted = run_design(design, draws, shift)
        large = run_design(design, draws, math.log(LARGE_RATIO))
        # The fixed protocol must be sized for the smallest change worth finding (1.2x).
        fixed = fixed_at_equal_power(draws, shift, planted["right_direction"])
        mix = (aa["mean_repetitions"] + planted["mean_repetitions"]
               + large["mean_repetitions"]) / 3
        saved = None if fixed["n"] is None else fixed["n"] / mix
        saved_planted = None if fixed["n"] is None else fixed["n"] / planted["mean_repetitions"]
        rows.append({
            "design": name, **design.to_json(),
            "aa": aa, "planted": planted, f"planted_{LARGE_RATIO}x": large,
            "fixed_at_equal_power": fixed,
            "fixed_default": {"n": DEFAULT_FIXED_REPEATS,
                              "power": fixed_power(draws, shift, DEFAULT_FIXED_REPEATS),
                              "aa_false_calls": fixed_power(draws, 0.0, DEFAULT_FIXED_REPEATS)},
            "mean_repetitions_mix": mix,
            "fixed_n_over_sequential_mean_planted": saved_planted,
            "fixed_n_over_sequential_mean_mix": saved,
            "targets": {
                "aa_false_calls": {"max": MAX_FALSE_CALLS, "measured": aa["calls"],
                                   "met": aa["calls"] <= MAX_FALSE_CALLS},
                "power_1_2x": {"min": MIN_POWER, "measured": planted["right_direction"],
                               "met": planted["right_direction"] >= MIN_POWER},
                "fewer_repetitions_than_fixed_at_equal_power_mix": {
                    "measured_ratio": saved, "met": saved is not None and saved > 1.0},
                "two_x_fewer_repetitions_mix": {
                    "min_ratio": 2.0, "measured_ratio": saved,
                    "met": saved is not None and saved >= 2.0},
            },
        })
    return {"metric": metric, "pool_size": int(pool.size),
            "paired_log_ratio_sd": float(pool.std(ddof=1)), "designs": rows}


def one_line(report: dict) -> str:
    parts = []
    for entry in report["metrics"]:
        for row in entry["designs"]:
            t = row["targets"]
            ratio = t["fewer_repetitions_than_fixed_at_equal_power_mix"]["measured_ratio"]
            flags = "".join("" if t[k]["met"] else "!" for k in t)
            parts.append(
                f"{entry['metric']}(sd {entry['paired_log_ratio_sd']:.2f}) {row['design']}: "
                f"A/A {t['aa_false_calls']['measured']:.1%} "
                f"power {t['power_1_2x']['measured']:.1%} "
                f"reps A/A {row['aa']['mean_repetitions']:.1f}, 1.2x "
                f"{row['planted']['mean_repetitions']:.1f}, {LARGE_RATIO}x "
                f"{row[f'planted_{LARGE_RATIO}x']['mean_repetitions']:.1f}"
                f" vs fixed n={row['fixed_at_equal_power']['n']}"
                f" ({'n/a' if ratio is None else f'x{ratio:.2f}'}){flags}")
    met = sum(t["met"] for e in report["metrics"] for r in e["designs"] for t in r["targets"].values())
    total = sum(len(r["targets"]) for e in report["metrics"] for r in e["designs"])
    return (f"sequential_sim_bench: {met}/{total} targets met ({report['sessions']} sessions "
            f"per cell, planted {PLANTED_RATIO}x; ! = not met): " + "; ".join(parts))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=SESSIONS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.sessions < 1:
        parser.error(f"--sessions={args.sessions} must be >= 1")
    try:
        document = json.loads(args.data.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"--data={str(args.data)!r}: not a readable noise file ({error})") from None
    report = {"benchmark": "sequential_sim_bench", "sessions": args.sessions, "seed": args.seed,
              "planted_ratio": PLANTED_RATIO, "noise_provenance": document["provenance"],
              "metrics": [bench_metric(document, metric, args.sessions, args.seed)
                          for metric in METRICS]}
    emit_report(report, one_line(report), output=args.output, as_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
