"""Stage D: chunked prefill (RFC "Experiment matrix", Stage D).

Main sweep: the RFC's 8K/16K/32K/64K chunk sizes (at the stage scale) and the
unchunked reference, on one workload, keeping only the planner's valid set;
an invalid size is written as an omitted case with the planner's reason. The
planner's plan is recorded next to each measurement (forwards, tail batches,
rows per rank, communication rounds) and the backend's forward steps must
match it. Then the best two sizes, with the unchunked reference, under a
balanced and an imbalanced workload at a low and a high prefix-hit ratio
(steady-state cache). Under ``--afd-study`` with references the sweep runs the
study's reference workload and policy, and the follow-ups run the study's
frozen best two sizes when it has them (select-references over Stage D sweep
results), not this session's: two sessions' best two differ within the noise
(suites/stage_study.py).
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
from stage_study import reference_evidence, study_reference

from pytest_afd.stats.verdicts import SWEEP_SOURCE

pytestmark = [pytest.mark.stage_d, pytest.mark.slow]

SWEEP_WORKLOAD = "bimodal"  # long requests that a chunk actually cuts
POLICY = "token_balanced"
FOLLOW_UP_WORKLOADS = ("uniform", "long_short")  # balanced, imbalanced
FOLLOW_UP_HIT_RATIOS = (0.0, 0.75)  # low, high


def _policy(options) -> str:
    reference = study_reference(options)
    return reference.policy if reference else POLICY


def _sweep_cases(stage_runner, workload, candidates, cached_tokens=None, phase="cold", prefix=""):
    """Valid candidates become cases; invalid ones are written as omitted right away."""
    round_capacity = stage_runner.sizes.tokens(LOGICAL_ROUND_CAPACITY)
    policy = _policy(stage_runner.options)
    base = stage_runner.settings(split_policy=policy, prefix_caching=phase == "steady")
    planned = plan_sweep(workload.prompt_lengths, candidates, base, round_capacity, cached_tokens)
    cases, omitted = [], []
    for candidate in planned:
        settings = stage_runner.settings(
            split_policy=policy,
            chunk_size=candidate.chunk_size,
            prefix_caching=phase == "steady",
        )
        name = f"{prefix}{workload.name}/{chunk_label(candidate.chunk_size)}"
        evidence = {"chunk_plan": candidate.plan.to_json(), "chunk_sweep": candidate.to_json(),
                    **reference_evidence(study_reference(stage_runner.options))}
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
        {"split_policy": _policy(context.options), "chunk_size": size, "prefix_caching": steady}
        for steady in (False, True)
        for size in scaled_candidates(context.sizes.tokens)
    ]


@pytest.mark.afd_deployments.with_args(_deployments)
def test_stage_d_chunk_sweep_then_best_two(stage_runner):
    reference = study_reference(stage_runner.options)
    candidates = scaled_candidates(stage_runner.sizes.tokens)
    workload = stage_runner.workload(reference.workload if reference else SWEEP_WORKLOAD)
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
    best_source = SWEEP_SOURCE
    if reference is not None and reference.logical_chunk_sizes is not None:
        best = [stage_runner.sizes.tokens(size) for size in reference.logical_chunk_sizes]
        best_source = f"the study {reference.study}"

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
        case.evidence["stage_d_best_sizes_source"] = best_source
    measured = stage_runner.measure(follow_ups, comparisons=_against_unchunked(follow_ups))
    stage_runner.require_evidence(sweep, "steps")
    for name, item in measured.items():
        requested = item.case.workload.spec.requested_hit_ratio
        assert (item.realized_hit_ratio > 0) == (requested > 0), (
            f"{name}: requested {requested}, realized {item.realized_hit_ratio}"
        )
