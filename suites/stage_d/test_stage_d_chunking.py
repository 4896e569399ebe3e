"""Stage D: chunked prefill (RFC "Experiment matrix", Stage D).

Main sweep: the RFC's 8K/16K/32K/64K chunk sizes (at the stage scale) and the
unchunked reference, on one workload, keeping only the planner's valid set;
an invalid size is written as an omitted case with the planner's reason. The
planner's plan is recorded next to each measurement (forwards, tail batches,
rows per rank, communication rounds) and the backend's forward steps must
match it. Then the best two sizes, with the unchunked reference, under a
balanced and an imbalanced workload at a low and a high prefix-hit ratio
(steady-state cache).
"""

from __future__ import annotations

import pytest
from stage_d_chunks import (
    LOGICAL_ROUND_CAPACITY,
    UNCHUNKED,
    best_sizes,
    chunk_label,
    plan_sweep,
    scaled_candidates,
)

pytestmark = [pytest.mark.stage_d, pytest.mark.slow]

SWEEP_WORKLOAD = "bimodal"  # long requests that a chunk actually cuts
POLICY = "token_balanced"
FOLLOW_UP_WORKLOADS = ("uniform", "long_short")  # balanced, imbalanced
FOLLOW_UP_HIT_RATIOS = (0.0, 0.75)  # low, high


def _sweep_cases(stage_runner, workload, candidates, cached_tokens=None, phase="cold", prefix=""):
    """Valid candidates become cases; invalid ones are written as omitted right away."""
    round_capacity = stage_runner.sizes.tokens(LOGICAL_ROUND_CAPACITY)
    base = stage_runner.settings(split_policy=POLICY, prefix_caching=phase == "steady")
    planned = plan_sweep(workload.prompt_lengths, candidates, base, round_capacity, cached_tokens)
    cases, omitted = [], []
    for candidate in planned:
        settings = stage_runner.settings(
            split_policy=POLICY,
            chunk_size=candidate.chunk_size,
            prefix_caching=phase == "steady",
        )
        name = f"{prefix}{workload.name}/{chunk_label(candidate.chunk_size)}"
        evidence = {"chunk_plan": candidate.plan.to_json(), "chunk_sweep": candidate.to_json()}
        if not candidate.plan.valid:
            stage_runner.record_omitted(
                name=name,
                workload=workload,
                settings=settings,
                reason="; ".join(candidate.plan.reasons),
                evidence=evidence,
            )
            omitted.append(candidate.chunk_size)
            continue
        cases.append(
            stage_runner.case(
                name=name, workload=workload, settings=settings, phase=phase, evidence=evidence
            )
        )
    return cases, omitted


def _against_unchunked(cases):
    """``--afd-sequential`` comparisons: every chunk size against the unchunked case
    measured on the same workload (the stage's reference)."""
    reference = {id(case.workload): case.name for case in cases
                 if case.settings.chunk_size is UNCHUNKED}
    return [(reference[id(case.workload)], case.name) for case in cases
            if case.settings.chunk_size is not UNCHUNKED and id(case.workload) in reference]


def _deployments(context):
    """Every candidate chunk size, cold (sweep) and steady (follow-ups); unused ones never deploy."""
    return [
        {"split_policy": POLICY, "chunk_size": size, "prefix_caching": steady}
        for steady in (False, True)
        for size in scaled_candidates(context.sizes.tokens)
    ]


@pytest.mark.afd_deployments.with_args(_deployments)
def test_stage_d_chunk_sweep_then_best_two(stage_runner):
    candidates = scaled_candidates(stage_runner.sizes.tokens)
    workload = stage_runner.workload(SWEEP_WORKLOAD)
    cases, omitted = _sweep_cases(stage_runner, workload, candidates, prefix="sweep/")
    sweep = stage_runner.measure(cases, comparisons=_against_unchunked(cases))
    throughput = {}
    for case in cases:
        item = sweep[case.name]
        assert item.result["metrics"]["failed_requests"] == 0, case.name
        throughput[case.settings.chunk_size] = item.throughput
        if item.has_step_evidence:
            plan = case.evidence["chunk_plan"]
            assert len(item.representative.steps) == plan["num_batches"], (
                f"{case.name}: the backend ran {len(item.representative.steps)} forward steps, "
                f"the planner planned {plan['num_batches']}"
            )
    assert UNCHUNKED not in omitted, "the unchunked reference must always be measurable"
    best = best_sizes(throughput)
    assert best, f"no valid chunk size among {candidates} (omitted: {omitted})"

    follow_ups = []
    for name in FOLLOW_UP_WORKLOADS:
        for ratio in FOLLOW_UP_HIT_RATIOS:
            hit_workload = stage_runner.workload(name, requested_hit_ratio=ratio)
            cached = list(hit_workload.cached_prefix_tokens)
            cases, _ = _sweep_cases(
                stage_runner,
                hit_workload,
                [*best, UNCHUNKED],
                cached_tokens=cached,
                phase="steady",
                prefix="best/",
            )
            follow_ups.extend(cases)
    for case in follow_ups:
        case.evidence["stage_d_best_sizes"] = best
    measured = stage_runner.measure(follow_ups, comparisons=_against_unchunked(follow_ups))
    stage_runner.require_evidence(sweep, "steps")
    for name, item in measured.items():
        requested = item.case.workload.spec.requested_hit_ratio
        assert (item.realized_hit_ratio > 0) == (requested > 0), (
            f"{name}: requested {requested}, realized {item.realized_hit_ratio}"
        )
