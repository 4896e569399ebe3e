"""afd_overlap_bench's measurement protocol on one runtime: workloads, cases, plans, rounds.

:func:`measure` runs the phases the bench's docstring lists (warm-up and calibration,
interleaved headline rounds, instrumented rounds) on one AFD runtime; :func:`analyse`
turns them into per-case entries and paired ratios with the noise floor of identical
plans. The bench (``afd_overlap_bench.py``) owns the command line, the runtime and
the targets.
"""

from __future__ import annotations

import os
import statistics

import numpy as np
from afd_overlap_analysis import case_entry, instrumented_ratio, modelled_step_ratio
from afd_overlap_evidence import calibration_samples, cpu_replay_s
from afd_overlap_stats import inside_noise, noise_floor, paired_ratio, round_record

from afd_split import plan_split
from afd_split.checks.metadata import BatchMetadata
from afd_split.plan.cost import fit_cost_model, use_cost_model

WORKLOADS = {
    "balanced": [192] * 8,
    "bimodal": [64, 320] * 4,
    "long_short": [1024] + [64] * 8,
}
POLICIES = ("none", "request_boundary", "token_balanced", "cost_balanced")
AA_CONTROL = "token_balanced_repeat"  # token_balanced's plan again: an A/A pair per workload
CASES = (*POLICIES, AA_CONTROL)
CALIBRATION_POLICIES = ("none", "request_boundary", "token_balanced")
MODELS = {
    "reduced_matched_experts": {"moe_intermediate_size": 128},
    "reduced": {},
    "reduced_wide_experts": {"moe_intermediate_size": 384},
}
BLOCK_SIZE = 128
RATIOS = (
    ("token_balanced", "request_boundary"),
    ("cost_balanced", "token_balanced"),
    ("token_balanced", "none"),
    (AA_CONTROL, "token_balanced"),
)


def make_batch(config, lengths, seed):
    metadata = BatchMetadata.from_requests(lengths, block_size=BLOCK_SIZE)
    ids = np.random.default_rng(seed).integers(0, config.vocab_size, sum(lengths))
    return ids, metadata


def make_plan(lengths, policy, cost_model=None):
    if policy == AA_CONTROL:
        policy = "token_balanced"
    if policy == "cost_balanced":
        with use_cost_model(cost_model):
            return plan_split(lengths, policy=policy)
    return plan_split(lengths, policy=policy)


def headline_record(evidence) -> dict:
    """What an uninstrumented step leaves for the statistics: wall, CPU and preemptions per rank."""
    return {
        "step_time_s": evidence["step_time_s"],
        "cpu_time_s": evidence["cpu_time_s"],
        "involuntary_switches": evidence["involuntary_switches"],
    }


def measure(runtime, model_name, config, args, rng, progress) -> dict:
    """Warm-up, calibration, interleaved headline rounds and instrumented rounds on one runtime."""
    batches = {name: make_batch(config, lengths, args.seed) for name, lengths in WORKLOADS.items()}
    span_counts = []

    def step(workload, plan, instrument):
        ids, metadata = batches[workload]
        result = runtime.run_forward(ids, metadata, plan, instrument=instrument)
        if instrument:
            span_counts.append(sum(len(spans) for spans in result.spans.values()))
            result.evidence["cpu_replay_s"] = cpu_replay_s(result.spans)
        return result.evidence

    samples = []
    if progress.emit is not None:
        steps = len(WORKLOADS) * len(CALIBRATION_POLICIES) * (args.warmups + args.calibration_repetitions)
        progress.emit(f"afd_overlap model={model_name}: warm-up and calibration ({steps} steps)")
    for workload, lengths in WORKLOADS.items():
        for policy in CALIBRATION_POLICIES:
            plan = make_plan(lengths, policy)
            for _ in range(args.warmups):
                step(workload, plan, instrument=False)
            for _ in range(args.calibration_repetitions):
                samples += calibration_samples(step(workload, plan, instrument=True), plan)
    cost_model = fit_cost_model(
        samples,
        num_moe_layers=len(config.moe_layer_indices),
        source=f"calibrated on {model_name}: {len(samples)} (layer, ubatch) samples",
    )
    plans = {(w, c): make_plan(WORKLOADS[w], c, cost_model) for w in WORKLOADS for c in CASES}
    for workload, case in plans:  # cost_balanced's plan and the A/A control get warmed too
        if case in (AA_CONTROL, "cost_balanced"):
            for _ in range(args.warmups):
                step(workload, plans[(workload, case)], instrument=False)
    headline = {key: [] for key in plans}
    instrumented = {key: [] for key in plans}
    run_order, round_loads = [], []
    rounds = [("headline", r) for r in range(args.repetitions)]
    rounds += [("instrumented", r) for r in range(args.instrumented_repetitions)]
    for phase, repetition in rounds:
        progress.step(model=model_name, phase=phase, round=repetition + 1)
        round_loads.append(os.getloadavg()[0])
        passes = args.steps_per_case if phase == "headline" else 1
        for workload in [list(WORKLOADS)[i] for i in rng.permutation(len(WORKLOADS))]:
            steps = {case: [] for case in CASES}
            for _ in range(passes):  # k passes over the five cases, each in a fresh order
                for case in [CASES[i] for i in rng.permutation(len(CASES))]:
                    evidence = step(workload, plans[(workload, case)], phase == "instrumented")
                    if phase == "instrumented":
                        instrumented[(workload, case)].append(evidence)
                    else:
                        steps[case].append(headline_record(evidence))
                    run_order.append([phase, repetition, workload, case])
            if phase == "headline":
                for case, records in steps.items():
                    headline[(workload, case)].append(round_record(records))
    return {
        "cost_model": cost_model,
        "plans": plans,
        "headline": headline,
        "instrumented": instrumented,
        "run_order": run_order,
        "round_loads": round_loads,
        "spans_per_step": statistics.median(span_counts) if span_counts else 0,
    }


def analyse(model_name, config, measured, seed) -> dict:
    workloads = {}
    for workload, lengths in WORKLOADS.items():
        cases = {
            case: case_entry(measured["plans"][(workload, case)], lengths, measured["cost_model"],
                             measured["headline"][(workload, case)],
                             measured["instrumented"][(workload, case)])
            for case in CASES
        }  # fmt: skip
        ratios = {}
        for index, (numerator, denominator) in enumerate(RATIOS):
            times = [[r["step_time_s"] for r in measured["headline"][(workload, c)]]
                     for c in (numerator, denominator)]  # fmt: skip
            ratio = paired_ratio(*times, seed=seed + index)
            ratio["identical_plans"] = (
                cases[numerator]["ubatch_tokens"] == cases[denominator]["ubatch_tokens"]
            )
            ratio["attention_cpu_ratio"] = (
                cases[numerator]["cpu_time_s"]["Attention rank 0"]["median"]
                / cases[denominator]["cpu_time_s"]["Attention rank 0"]["median"]
            )
            # The fitted cost model's MoE-layer makespans (thread-CPU based: load-independent).
            ratio["modelled"] = (
                cases[numerator]["modelled_makespan_s"] / cases[denominator]["modelled_makespan_s"]
            )
            ratio["modelled_step"] = modelled_step_ratio(cases[numerator], cases[denominator])
            ratio["cpu_replay"] = instrumented_ratio(
                cases[numerator], cases[denominator], "cpu_replay_s"
            )
            ratios[f"{numerator}_over_{denominator}"] = ratio
        workloads[workload] = {
            "prompt_lengths": lengths,
            "total_tokens": sum(lengths),
            "policies": cases,
            "ratios": ratios,
        }
    identical = {
        f"{workload}:{name}": ratio
        for workload, entry in workloads.items()
        for name, ratio in entry["ratios"].items()
        if ratio["identical_plans"]
    }
    floor = noise_floor(list(identical.values()))
    for entry in workloads.values():
        for ratio in entry["ratios"].values():
            ratio["inside_noise_floor"] = inside_noise(ratio, floor)
    return {
        "config": {
            "name": model_name,
            "overrides": MODELS[model_name],
            "num_hidden_layers": config.num_hidden_layers,
            "moe_layers": len(config.moe_layer_indices),
            "hidden_size": config.hidden_size,
            "moe_intermediate_size": config.moe_intermediate_size,
        },
        "cost_model": measured["cost_model"].to_evidence(),
        "noise_floor": floor,
        "identical_plan_pairs": identical,
        "loadavg_per_round": measured["round_loads"],
        "workloads": workloads,
        "run_order": measured["run_order"],
    }
