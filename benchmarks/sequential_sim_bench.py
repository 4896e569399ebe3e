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

Per metric, for the default design (``pytest_afd.stats.sequential.SequentialDesign``:
a look after every repetition from 3 to 16, alpha spent exactly by a calibrated
per-look level, a one-sided 10% futility bound stopping ``equivalent`` within 1.2x)
and the earlier rule (``SequentialDesign.bonferroni()``: looks 3, 5, 8, 12, 16,
alpha/5 per look, equivalence within 5%), 1,000 sessions each:

* A/A: the false-call rate (an interval excluding a ratio of 1) — target <= 5%, on
  10x the sessions (a rule that spends alpha exactly sits near 5%);
* a planted 1.2x change (``+log 1.2`` on every log-ratio): the power (the change
  found, in its direction) — target >= 80%;
* the mean repetitions used, A/A and planted, against the fixed protocol at
  equal error rates: the smallest fixed ``n`` whose paired t-test at the design's
  alpha on the same sessions finds the planted change at least as often as the
  sequential rule did; and against the default fixed 3 (t-test at 5%);
* per truth (A/A, 1.2x, 1.5x) and over the bench's mix (one third each: no change,
  the smallest change worth finding, a clear one), the fixed ``n`` over the
  sequential mean repetitions — goals > 1 and >= 2 on the mix; the mix of the
  study's own comparisons is measured by ``sequential_stage_bench.py``;
* a bound, not a rule: the same design if each comparison's noise sd were *known*
  (z instead of t, looks from 2), against the fixed z-test at equal power: what the
  t rule loses by estimating the sd from its own 3-16 repetitions;
* on CPU-time noise, other boundary families (``sequential_families.py``: each
  family's best rule from a scratch search, its validity measured), against the same
  fixed comparator on the bench's sessions and on two fresh session sets: the
  summary says how many valid rules met every target on every set.

JSON: one ``met`` flag per target and design; one summary line on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import numpy as np
import sequential_families
from bench_load import emit_report
from scipy import stats as scipy_stats

from pytest_afd.stats.sequential import (
    STOP_THRESHOLD,
    VERDICT_HIGHER,
    SequentialDesign,
    decide_sequence,
)
from pytest_afd.stats.sequential_bounds import CALIBRATION_SEED, calibration_target

DATA = Path(__file__).resolve().parent / "data" / "sequential_noise_cpu.json"
SESSIONS = 1000
AA_SESSIONS_FACTOR = 10
"""The A/A cell draws 10x the sessions: the calibrated rule spends alpha exactly, so its
false-call rate sits near 5%, and 1,000 sessions (Monte Carlo sd 0.7 points) could not
tell 4.5% from 5.5%; 10,000 can (sd 0.2 points)."""
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


def fixed_power(draws: np.ndarray, shift: float, n: int, alpha: float = FIXED_ALPHA) -> float:
    """Share of sessions whose first ``n`` log-ratios a two-sided paired t-test calls."""
    data = draws[:, :n] + shift
    sd = data.std(axis=1, ddof=1)
    t = np.divide(data.mean(axis=1), sd / math.sqrt(n), out=np.zeros(len(data)), where=sd > 0)
    return float(np.mean(np.abs(t) > scipy_stats.t.ppf(1 - alpha / 2, n - 1)))


def fixed_at_equal_power(draws: np.ndarray, shift: float, power: float, alpha: float) -> dict:
    """The smallest fixed n whose t-test at the same ``alpha`` reaches ``power`` on the
    same sessions: the fixed protocol at equal error rates."""
    for n in range(DEFAULT_FIXED_REPEATS, draws.shape[1] + 1):
        reached = fixed_power(draws, shift, n, alpha)
        if reached >= power:
            return {"n": n, "alpha": alpha, "power": reached}
    return {"n": None, "note": f"no n <= {draws.shape[1]} reaches the sequential power"}


KNOWN_SD_LOOKS = tuple(range(2, 17))
KNOWN_SD_SEQUENCES = 100_000


def _z_bound(looks: tuple[int, ...], level: float, sides: int) -> float:
    """One z boundary for every look, calibrated so any look crosses with ``level``."""
    z = np.random.default_rng(CALIBRATION_SEED).standard_normal((KNOWN_SD_SEQUENCES, max(looks)))
    paths = np.cumsum(z, axis=1)[:, [n - 1 for n in looks]] / np.sqrt(looks)
    paths = np.abs(paths) if sides == 2 else paths
    return float(np.quantile(paths.max(axis=1), 1 - calibration_target(level, KNOWN_SD_SEQUENCES)))


def known_sd_bound(draws: np.ndarray, sd: float, design: SequentialDesign) -> dict:
    """The design's rule with the noise sd known (z bounds, looks from 2): a bound on
    what any per-comparison rule could save, with the fixed z-test at equal power."""
    efficacy = _z_bound(KNOWN_SD_LOOKS, design.alpha, 2)
    futility = _z_bound(KNOWN_SD_LOOKS, design.futility_level, 1)
    margin = math.log1p(design.equivalence_margin)
    rows = {}
    for name, ratio in (("aa", 1.0), ("planted", PLANTED_RATIO), ("large", LARGE_RATIO)):
        data = draws[:, :max(KNOWN_SD_LOOKS)] + math.log(ratio)
        reps = np.full(len(data), max(KNOWN_SD_LOOKS))
        verdict = np.zeros(len(data))
        done = np.zeros(len(data), dtype=bool)
        for n in KNOWN_SD_LOOKS:
            mean, se = data[:, :n].mean(axis=1), sd / math.sqrt(n)
            call = ~done & (np.abs(mean) > efficacy * se)
            verdict[call], reps[call] = np.sign(mean[call]), n
            done |= call
            equivalent = ~done & (np.abs(mean) + futility * se < margin)
            reps[equivalent] = n
            done |= equivalent
        rows[name] = {"calls": float(np.mean(verdict != 0)),
                      "right_direction": float(np.mean(verdict > 0)),
                      "mean_repetitions": float(reps.mean())}
    power = rows["planted"]["right_direction"]
    critical = scipy_stats.norm.ppf(1 - design.alpha / 2)
    fixed_n = next((n for n in range(1, draws.shape[1] + 1)
                    if np.mean((draws[:, :n].mean(axis=1) + math.log(PLANTED_RATIO))
                               / (sd / math.sqrt(n)) > critical) >= power), None)
    mix = sum(r["mean_repetitions"] for r in rows.values()) / len(rows)
    return {"note": "a bound, not a rule: each comparison's sd is unknown in practice",
            "looks": list(KNOWN_SD_LOOKS), "z_efficacy": efficacy, "z_futility": futility,
            **rows, "fixed_z_test_n_at_equal_power": fixed_n,
            "fixed_n_over_mean_mix": None if fixed_n is None else fixed_n / mix}


def per_truth_ratios(fixed_n: int | None, rows: dict[str, dict]) -> dict:
    if fixed_n is None:
        return {}
    return {name: fixed_n / row["mean_repetitions"] for name, row in rows.items()}


def bench_metric(document: dict, metric: str, count: int, seed: int,
                 family_sequences: int = sequential_families.SEQUENCES) -> dict:
    pool = noise_pool(document, metric)
    shift = math.log(PLANTED_RATIO)
    draws = sessions(pool, count, MAX_FIXED_SEARCH, seed)
    aa_draws = sessions(pool, count * AA_SESSIONS_FACTOR, MAX_FIXED_SEARCH, seed + 1)
    designs = {"calibrated": SequentialDesign(), "bonferroni_before": SequentialDesign.bonferroni()}
    rows = []
    for name, design in designs.items():
        aa = {**run_design(design, aa_draws, 0.0), "sessions": len(aa_draws)}
        planted = run_design(design, draws, shift)
        large = run_design(design, draws, math.log(LARGE_RATIO))
        # The fixed protocol must be sized for the smallest change worth finding (1.2x).
        fixed = fixed_at_equal_power(draws, shift, planted["right_direction"], design.alpha)
        if fixed["n"] is not None:
            fixed["aa_false_calls"] = fixed_power(aa_draws, 0.0, fixed["n"], design.alpha)
        mix = (aa["mean_repetitions"] + planted["mean_repetitions"]
               + large["mean_repetitions"]) / 3
        saved = None if fixed["n"] is None else fixed["n"] / mix
        saved_planted = None if fixed["n"] is None else fixed["n"] / planted["mean_repetitions"]
        truths = {"aa": aa, f"{PLANTED_RATIO}x": planted, f"{LARGE_RATIO}x": large}
        rows.append({
            "design": name, **design.to_json(),
            "aa": aa, "planted": planted, f"planted_{LARGE_RATIO}x": large,
            "fixed_at_equal_power": fixed,
            "fixed_default": {"n": DEFAULT_FIXED_REPEATS,
                              "power": fixed_power(draws, shift, DEFAULT_FIXED_REPEATS),
                              "aa_false_calls": fixed_power(aa_draws, 0.0,
                                                            DEFAULT_FIXED_REPEATS)},
            "mean_repetitions_mix": mix,
            "fixed_n_over_sequential_mean_per_truth": per_truth_ratios(fixed["n"], truths),
            "fixed_default_over_sequential_mean_mix": DEFAULT_FIXED_REPEATS / mix,
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
    sd = float(pool.std(ddof=1))
    report = {"metric": metric, "pool_size": int(pool.size), "paired_log_ratio_sd": sd,
              "designs": rows, "known_sd_bound": known_sd_bound(draws, sd, designs["calibrated"])}
    if metric == FAMILIES_METRIC:
        report["design_families"] = design_families(pool, draws, aa_draws, seed,
                                                    family_sequences)
    return report


FAMILIES_METRIC = "cpu_time_s"
"""The noise the families were searched on (on wall time no rule reaches 80% power)."""


FRESH_SEED_OFFSETS = (100, 200)
"""The families' parameters were searched on the bench's own sessions (seed 0), which
makes those sessions a biased test of them: each rule is re-run on two fresh sets."""


def _family_cell(rule: dict, draws: np.ndarray, aa_draws: np.ndarray) -> dict:
    looks = rule["looks"]
    truths = {name: sequential_families.run_rule(looks, rule["efficacy"], rule["futility"],
                                                 data, math.log(ratio))
              for name, data, ratio in (("aa", aa_draws, 1.0), ("planted", draws, PLANTED_RATIO),
                                        (f"planted_{LARGE_RATIO}x", draws, LARGE_RATIO))}
    power = truths["planted"]["right_direction"]
    fixed = fixed_at_equal_power(draws, math.log(PLANTED_RATIO), power, sequential_families.ALPHA)
    mix = sum(t["mean_repetitions"] for t in truths.values()) / len(truths)
    ratio = None if fixed["n"] is None else fixed["n"] / mix
    return {**truths, "fixed_at_equal_power": fixed, "mean_repetitions_mix": mix,
            "fixed_n_over_sequential_mean_mix": ratio,
            "meets_all": bool(truths["aa"]["calls"] <= MAX_FALSE_CALLS and power >= MIN_POWER
                              and ratio is not None and ratio >= 2.0)}


def design_families(pool: np.ndarray, draws: np.ndarray, aa_draws: np.ndarray, seed: int,
                    sequences: int = sequential_families.SEQUENCES) -> list[dict]:
    """Each family's best rule (``sequential_families``) against the same fixed comparator,
    on the bench's sessions and on fresh ones: is there a valid rule that reaches 2x?"""
    fresh = [(sessions(pool, len(draws), draws.shape[1], seed + offset),
              sessions(pool, len(aa_draws), draws.shape[1], seed + offset + 1))
             for offset in FRESH_SEED_OFFSETS]
    rows = []
    for rule in sequential_families.family_rules(sequences):
        crossing = sequential_families.any_look_crossing(rule["looks"], rule["efficacy"],
                                                         sequences)
        cell = _family_cell(rule, draws, aa_draws)
        others = [_family_cell(rule, d, a) for d, a in fresh]
        rows.append({"family": rule["family"], "params": rule["params"], "note": rule["note"],
                     "looks": list(rule["looks"]), "any_look_crossing_fresh_paths": crossing,
                     "valid": sequential_families.is_valid(crossing, sequences),
                     "calibration_sequences": sequences, **cell,
                     "fresh_sessions": [{"seed": seed + o,
                                         "aa_false_calls": c["aa"]["calls"],
                                         "power": c["planted"]["right_direction"],
                                         "fixed_n": c["fixed_at_equal_power"]["n"],
                                         "ratio_mix": c["fixed_n_over_sequential_mean_mix"]}
                                        for o, c in zip(FRESH_SEED_OFFSETS, others, strict=True)],
                     "meets_all_on_every_session_set": cell["meets_all"]
                     and all(c["meets_all"] for c in others)})
    return rows


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"x{value:.2f}"


def _worst_ratio(row: dict) -> float:
    ratios = [row["fixed_n_over_sequential_mean_mix"]] + [c["ratio_mix"]
                                                          for c in row["fresh_sessions"]]
    return min(r if r is not None else 0.0 for r in ratios)


def families_line(families: list[dict]) -> str:
    """Whether any valid family rule met 2x on every session set, and the best one by its
    worst session set (the bench's own sessions chose it, so they flatter it)."""
    valid = [f for f in families if f["valid"]]
    meeting = sum(f["meets_all_on_every_session_set"] for f in valid)
    head = f"2x on every session set: {meeting} of {len(valid)} valid family rules"
    if not valid:
        return head
    best = max(valid, key=_worst_ratio)
    params = ",".join(f"{k}={v}" for k, v in best["params"].items())
    ceiling = [f for f in families if not f["valid"]]
    tail = "".join(f"; {f['family']} {_ratio(f['fixed_n_over_sequential_mean_mix'])} (not valid)"
                   for f in ceiling)
    return (f"{head} (best, worst of {1 + len(best['fresh_sessions'])} session sets: "
            f"{best['family']}({params}) {_ratio(_worst_ratio(best))}, "
            f"{_ratio(best['fixed_n_over_sequential_mean_mix'])} on the bench's own{tail})")


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
        bound = entry["known_sd_bound"]["fixed_n_over_mean_mix"]
        parts.append(f"{entry['metric']} known-sd bound x"
                     f"{'n/a' if bound is None else f'{bound:.2f}'}")
    met = sum(t["met"] for e in report["metrics"] for r in e["designs"] for t in r["targets"].values())
    total = sum(len(r["targets"]) for e in report["metrics"] for r in e["designs"])
    families = [families_line(e["design_families"]) for e in report["metrics"]
                if e.get("design_families")]
    return (f"sequential_sim_bench: {met}/{total} targets met ({report['sessions']} sessions "
            f"per cell, planted {PLANTED_RATIO}x; ! = not met): " + "; ".join(families + parts))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=SESSIONS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--family-sequences", type=int, default=sequential_families.SEQUENCES,
                        help="null paths per family calibration (fewer: faster, coarser)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    if args.sessions < 1:
        parser.error(f"--sessions={args.sessions} must be >= 1")
    if args.family_sequences < sequential_families.MIN_SEQUENCES:
        parser.error(f"--family-sequences={args.family_sequences} must be >= "
                     f"{sequential_families.MIN_SEQUENCES}")
    try:
        document = json.loads(args.data.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"--data={str(args.data)!r}: not a readable noise file ({error})") from None
    report = {"benchmark": "sequential_sim_bench", "sessions": args.sessions, "seed": args.seed,
              "planted_ratio": PLANTED_RATIO, "noise_provenance": document["provenance"],
              "metrics": [bench_metric(document, metric, args.sessions, args.seed,
                                       args.family_sequences)
                          for metric in METRICS]}
    emit_report(report, one_line(report), output=args.output, as_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
