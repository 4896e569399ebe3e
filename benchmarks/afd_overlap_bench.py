"""Two-stage AFD overlap on the CPU process topology: split policies side by side.

    python benchmarks/afd_overlap_bench.py --json

One 1 Attention + 1 FFN runtime per model variant runs three workloads of equal
total tokens (balanced, bimodal, one long request with several short ones)
under four policies (none, request_boundary, token_balanced, cost_balanced).
Phases, all on the same runtime:

1. warm-up + calibration: ``--calibration-repetitions`` instrumented steps per
   (workload, policy != cost); the per-layer, per-ubatch times fit the cost
   model cost_balanced then uses.
2. headline: ``--repetitions`` uninstrumented steps per case, interleaved in a
   seeded shuffled order each round (no per-op timing: the step time only).
3. evidence: ``--instrumented-repetitions`` instrumented steps per case, also
   interleaved: bubble, overlap, critical path, per-ubatch times, load.

Profiler overhead = median instrumented / median headline step time - 1.
Models: ``reduced`` (the recipe's 10 layers, tiny width; the default) and, with
``--models reduced,reduced_wide_experts``, wider experts that make the FFN side
the heavier one. Timings come from a shared CPU host; the load average is
recorded next to them. Ratios are given of medians (the headline) and of
minimums (the least disturbed run: interference from other processes only
ever adds time). When two policies produce the same plan their ratio is a
measurement of the noise floor, flagged ``identical_plans``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import torch

from afd_split import BatchMetadata, plan_split
from afd_split.cost import (
    StageSample,
    attended_keys_per_row,
    fit_cost_model,
    modelled_plan_cost,
    use_cost_model,
)
from pytest_afd.backends.cpu import named_config
from pytest_afd.backends.cpu.afd import AfdRuntime
from pytest_afd.backends.cpu.afd.evidence import ATTENTION, Timeline

WORKLOADS = {
    "balanced": [192] * 8,
    "bimodal": [64, 320] * 4,
    "long_short": [1024] + [64] * 8,
}
POLICIES = ("none", "request_boundary", "token_balanced", "cost_balanced")
CALIBRATION_POLICIES = ("none", "request_boundary", "token_balanced")
MODELS = {
    "reduced": {},
    "reduced_wide_experts": {"moe_intermediate_size": 384},
}
BLOCK_SIZE = 128
RATIOS = (
    ("token_balanced", "request_boundary"),
    ("cost_balanced", "token_balanced"),
    ("token_balanced", "none"),
)
MIN_REPETITIONS = 3  # the RFC: at least three measured repetitions, with dispersion


def make_batch(config, lengths, seed):
    metadata = BatchMetadata.from_requests(lengths, block_size=BLOCK_SIZE)
    ids = np.random.default_rng(seed).integers(0, config.vocab_size, sum(lengths))
    return ids, metadata


def make_plan(lengths, policy, cost_model=None):
    if policy == "cost_balanced":
        with use_cost_model(cost_model):
            return plan_split(lengths, policy=policy)
    return plan_split(lengths, policy=policy)


def ubatch_keys(plan) -> list[int]:
    """Attended keys of each ubatch's real rows (fresh prefill: no computed context)."""
    keys = attended_keys_per_row(np.asarray(plan.num_scheduled_tokens), None, None)
    return [int(keys[u.token_slice].sum()) for u in plan.ubatches]


def calibration_samples(evidence, plan) -> list[StageSample]:
    """Per (MoE layer, ubatch): rows, keys and the stage's thread-CPU seconds.

    CPU time, not wall time: on a shared host wall time includes whatever else
    the OS ran, and a cost model fitted to that noise would steer the cut by it.
    """
    keys = ubatch_keys(plan)
    table = evidence["per_layer_cpu"]
    ffn_rows = {(r["layer"], r["ubatch"]): r for r in table["ffn"]}
    samples = []
    for row in table["attention"]:
        if row["ubatch"] < 0 or (row["layer"], row["ubatch"]) not in ffn_rows:
            continue
        ffn = ffn_rows[(row["layer"], row["ubatch"])]
        samples.append(
            StageSample(
                num_rows=plan.ubatches[row["ubatch"]].num_rows,
                num_keys=keys[row["ubatch"]],
                attention_s=row.get("attention", 0.0) + row.get("route", 0.0),
                expert_s=ffn.get("routed_moe", 0.0) + ffn.get("shared_moe", 0.0),
                transfer_s=row.get("dispatch", 0.0) + ffn.get("recv", 0.0) + ffn.get("send", 0.0),
            )
        )
    return samples


SPAN_COST_SAMPLES = 20_000


def span_cost_s() -> float:
    """Seconds one instrumentation span costs (two clocks read twice, one append).

    Measured directly because the end-to-end overhead (instrumented vs headline
    medians) is below this host's run-to-run noise.
    """
    timeline = Timeline(True)
    started = time.perf_counter()
    for _ in range(SPAN_COST_SAMPLES):
        with timeline.span(ATTENTION, 0, 0):
            pass
    return (time.perf_counter() - started) / SPAN_COST_SAMPLES


def dispersion(values):
    ordered = sorted(values)
    q1, _, q3 = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else (ordered[0],) * 3
    median = statistics.median(ordered)
    return {
        "median": median,
        "min": ordered[0],
        "max": ordered[-1],
        "iqr": q3 - q1,
        "rel_iqr": (q3 - q1) / median if median else None,
        "samples": ordered,
    }


def per_ubatch_times(evidence) -> dict:
    """Attention-side and FFN-side busy seconds per ubatch, summed over MoE layers."""
    out = {"attention_s": {}, "expert_s": {}}
    for row in evidence["per_layer"]["attention"]:
        if row["ubatch"] >= 0:
            key = str(row["ubatch"])
            value = row.get("attention", 0.0) + row.get("route", 0.0)
            out["attention_s"][key] = out["attention_s"].get(key, 0.0) + value
    for row in evidence["per_layer"]["ffn"]:
        key = str(row["ubatch"])
        value = row.get("routed_moe", 0.0) + row.get("shared_moe", 0.0)
        out["expert_s"][key] = out["expert_s"].get(key, 0.0) + value
    return out


def summarize_instrumented(runs) -> dict:
    med = statistics.median
    last = runs[-1]
    return {
        "step_time_s": med(r["step_time_s"] for r in runs),
        "exposed_bubble_s": med(r["exposed_bubble_s"] for r in runs),
        "ffn_idle_s": med(r["ffn_idle_s"] for r in runs),
        "overlap_fraction": med(r["overlap_fraction"] for r in runs),
        "critical_path_s": med(r["critical_path_s"] for r in runs),
        "critical_path_by_kind_s": last["critical_path_by_kind_s"],
        "attention_busy_cpu_s": med(
            sum(v for k, v in r["totals_cpu_s"]["attention"].items() if k != "wait") for r in runs
        ),
        "attention_busy_s": med(
            sum(v for k, v in r["totals_s"]["attention"].items() if k != "wait") for r in runs
        ),
        "ffn_busy_s": med(
            sum(v for k, v in r["totals_s"]["ffn"].items() if k != "ffn_idle") for r in runs
        ),
        "per_ubatch": per_ubatch_times(last),
        "straggler_s": med(r["straggler_s"] for r in runs),
        "worst_expert_max_over_mean": last["load"]["worst_expert_max_over_mean"],
        "mean_expert_cv": float(
            np.mean([layer["expert"]["cv"] or 0.0 for layer in last["load"]["per_layer"]])
        ),
    }


def run_model(model_name, overrides, args, rng) -> dict:
    config = named_config("reduced", **overrides)
    batches = {name: make_batch(config, lengths, args.seed) for name, lengths in WORKLOADS.items()}
    started = time.perf_counter()
    with AfdRuntime(config, args.seed, threads_per_rank=args.threads_per_rank) as runtime:
        startup_s = time.perf_counter() - started

        span_counts = []

        def step(workload, plan, instrument):
            ids, metadata = batches[workload]
            result = runtime.run_forward(ids, metadata, plan, instrument=instrument)
            if instrument:
                span_counts.append([len(spans) for spans in result.spans.values()])
            return result.evidence

        # Phase 1: warm-up + calibration.
        samples = []
        for workload, lengths in WORKLOADS.items():
            for policy in CALIBRATION_POLICIES:
                plan = make_plan(lengths, policy)
                step(workload, plan, instrument=False)
                for _ in range(args.calibration_repetitions):
                    samples += calibration_samples(step(workload, plan, instrument=True), plan)
        cost_model = fit_cost_model(
            samples,
            num_moe_layers=len(config.moe_layer_indices),
            source=f"calibrated on {model_name}: {len(samples)} (layer, ubatch) samples",
        )
        plans = {
            (w, p): make_plan(WORKLOADS[w], p, cost_model) for w in WORKLOADS for p in POLICIES
        }
        cases = list(plans)
        run_order = []
        headline = {case: [] for case in cases}
        instrumented = {case: [] for case in cases}
        for phase, repetitions in (
            ("headline", args.repetitions),
            ("instrumented", args.instrumented_repetitions),
        ):
            for repetition in range(repetitions):
                order = [cases[i] for i in rng.permutation(len(cases))]
                for workload, policy in order:
                    evidence = step(workload, plans[(workload, policy)], phase == "instrumented")
                    target = instrumented if phase == "instrumented" else headline
                    target[(workload, policy)].append(evidence)
                    run_order.append([phase, repetition, workload, policy])
    workloads = {}
    for workload, lengths in WORKLOADS.items():
        policies = {}
        for policy in POLICIES:
            plan = plans[(workload, policy)]
            plan_evidence = plan.to_evidence()
            modelled = modelled_plan_cost(cost_model, np.asarray(lengths), None, plan.split_token)
            policies[policy] = {
                "split_token": plan.split_token,
                "boundary_request": plan.boundary_request,
                "imbalance": plan_evidence["imbalance"],
                "row_imbalance": plan_evidence["row_imbalance"],
                "ubatch_tokens": [u["num_real_tokens"] for u in plan_evidence["ubatches"]],
                "step_time_s": dispersion([e["step_time_s"] for e in headline[(workload, policy)]]),
                # CPU seconds per rank in the same headline runs: load-independent work.
                "cpu_time_s": {
                    rank: statistics.median(
                        e["cpu_time_s"][rank] for e in headline[(workload, policy)]
                    )
                    for rank in headline[(workload, policy)][0]["cpu_time_s"]
                },
                "instrumented": summarize_instrumented(instrumented[(workload, policy)]),
                "modelled_makespan_s": modelled["makespan_s"],
            }
        med = {p: policies[p]["step_time_s"]["median"] for p in POLICIES}
        best = {p: policies[p]["step_time_s"]["min"] for p in POLICIES}
        ratios = {}
        for numerator, denominator in RATIOS:
            same = policies[numerator]["split_token"] == policies[denominator]["split_token"]
            ratios[f"{numerator}_over_{denominator}"] = {
                "median": med[numerator] / med[denominator],
                "min": best[numerator] / best[denominator],
                "identical_plans": same,
            }
        workloads[workload] = {
            "prompt_lengths": lengths,
            "total_tokens": sum(lengths),
            "policies": policies,
            "ratio_token_balanced_over_request_boundary": ratios[
                "token_balanced_over_request_boundary"
            ]["median"],
            "ratios": ratios,
        }
    overhead = [
        statistics.median(r["step_time_s"] for r in instrumented[case])
        / statistics.median(r["step_time_s"] for r in headline[case])
        - 1.0
        for case in cases
    ]
    spans_per_step = statistics.median(sum(counts) for counts in span_counts)
    per_span = span_cost_s()
    step_median = statistics.median(e["step_time_s"] for runs in headline.values() for e in runs)
    return {
        "config": {
            "name": model_name,
            "overrides": overrides,
            "num_hidden_layers": config.num_hidden_layers,
            "moe_layers": len(config.moe_layer_indices),
            "hidden_size": config.hidden_size,
            "moe_intermediate_size": config.moe_intermediate_size,
        },
        "runtime": runtime.describe(),
        "startup_s": startup_s,
        "cost_model": cost_model.to_evidence(),
        "profiler_overhead": {
            "median": statistics.median(overhead),
            "per_case": overhead,
            "span_cost_s": per_span,
            "spans_per_step": spans_per_step,
            "direct_overhead_fraction": per_span * spans_per_step / step_median,
        },
        "workloads": workloads,
        "run_order": run_order,
    }


def print_table(result) -> None:
    for model_name, model in result["models"].items():
        print(
            f"\n== {model_name} (startup {model['startup_s']:.1f}s, profiler overhead: "
            f"end-to-end {100 * model['profiler_overhead']['median']:+.1f}%, direct "
            f"{100 * model['profiler_overhead']['direct_overhead_fraction']:.3f}%)"
        )
        header = (
            f"{'workload':11} {'policy':17} {'cut':>5} {'imbal':>6} {'step med':>9} {'rel IQR':>8} "
        )
        print(header + f"{'bubble':>7} {'overlap':>8} {'model':>7}")
        for workload, entry in model["workloads"].items():
            for policy, p in entry["policies"].items():
                inst = p["instrumented"]
                imbalance = "-" if p["imbalance"] is None else f"{p['imbalance']:.2f}"
                print(
                    f"{workload:11} {policy:17} {p['split_token'] or '-':>5} {imbalance:>6} "
                    f"{p['step_time_s']['median']:9.3f} {p['step_time_s']['rel_iqr'] or 0:8.2f} "
                    f"{inst['exposed_bubble_s']:7.3f} {inst['overlap_fraction']:8.2f} "
                    f"{p['modelled_makespan_s']:7.3f}"
                )
            for name, ratio in entry["ratios"].items():
                same = " (identical plans: noise floor)" if ratio["identical_plans"] else ""
                print(f"{'':11} {name}: median {ratio['median']:.3f}, min {ratio['min']:.3f}{same}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--instrumented-repetitions", type=int, default=2)
    parser.add_argument("--calibration-repetitions", type=int, default=2)
    parser.add_argument("--models", default="reduced", help=f"comma list from {sorted(MODELS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads-per-rank", type=int, default=1)
    args = parser.parse_args(argv)
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; expected a subset of {sorted(MODELS)}")
    if args.repetitions < MIN_REPETITIONS:
        parser.error(
            f"--repetitions={args.repetitions}; the RFC requires at least {MIN_REPETITIONS}"
        )
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    load_before = os.getloadavg()
    started = time.perf_counter()
    result = {
        "benchmark": "afd_overlap_bench",
        "host": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "loadavg_before": load_before,
        },
        "repetitions": args.repetitions,
        "instrumented_repetitions": args.instrumented_repetitions,
        "seed": args.seed,
        "models": {name: run_model(name, MODELS[name], args, rng) for name in models},
    }
    result["host"]["loadavg_after"] = os.getloadavg()
    result["wall_s"] = time.perf_counter() - started
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
