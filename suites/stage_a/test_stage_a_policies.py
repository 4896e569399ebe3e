"""Stage A: split-policy validation (RFC "Experiment matrix", Stage A).

none vs request-boundary vs token-balanced on balanced, bimodal, heavy-tailed
and long+short workloads, on the session's model first (``--afd-model``,
default the reduced ten-layer one), then the winning and control cases on the
full model. Realized per-ubatch imbalance is correlated with step cost: the
run time relative to the unsplit run always (non-instrumented), and Attention/FFN
overlap, exposed bubble and FFN straggler time when the backend's instrumented
steps carry AFD evidence.

The smallest size (half the stage scale) runs in the default test run (CI);
the stage-scale matrix and the full-model repeat are ``slow``.
"""

from __future__ import annotations

import pytest
from stage_a_analysis import (
    BASELINE_POLICY,
    CANDIDATE_POLICY,
    CONTROL_POLICY,
    POLICIES,
    afd_overlap,
    confirmation_case_policies,
    correlation_evidence,
    rank_policies,
)

from pytest_afd.core.backend import CAP_AFD, CAP_INSTRUMENTATION
from pytest_afd.results.manifest import absent
from pytest_afd.results.stand_in import with_served_facts

pytestmark = pytest.mark.stage_a

# The RFC's four Stage A shapes (pytest_afd.workloads names).
WORKLOADS = ("uniform", "bimodal", "heavy_tailed", "long_short")
# Confirmation on the full model: the shape a request-boundary split cannot
# balance, and the balanced control shape.
FULL_MODEL_WORKLOADS = ("long_short", "uniform")
FULL_MODEL = "full"
# Multipliers on the stage scale: "smallest" is what CI runs.
SIZES = {"smallest": 0.5, "stage": 1.0}
# Fixed bootstrap seed: the significance verdict is reproducible from the result files.
BOOTSTRAP_SEED = 0
# Session-wide store so the full-model repeat can use the matrix's winner (None:
# no significant difference).
WINNER_KEY = pytest.StashKey["str | None"]()


def _case_name(workload: str, policy: str) -> str:
    return f"{workload}/{policy}"


def _uses_afd_roles(runner) -> bool:
    """Run Attention and FFN apart whenever the backend can and the topology is AFD.

    Overlap only exists when the roles run concurrently; a backend that always
    deploys AFD apart ignores the setting.
    """
    return CAP_AFD in runner.backend.capabilities and runner.topology.is_afd


def _matrix_cases(stage_runner, size: float, workloads=WORKLOADS, policies=POLICIES):
    cases = []
    scale = stage_runner.sizes.scale * size
    afd_processes = _uses_afd_roles(stage_runner)
    for workload_name in workloads:
        workload = stage_runner.workload(workload_name, scale=scale)
        for policy in policies:
            cases.append(
                stage_runner.case(
                    name=_case_name(workload_name, policy),
                    workload=workload,
                    settings=stage_runner.settings(
                        split_policy=policy, afd_processes=afd_processes
                    ),
                )
            )
    return cases


def _layer_count(manifest) -> int | None:
    """The manifest's layer count, None when absent (a deployment not up yet reports none)."""
    value = manifest["model"]["num_layers"]
    return value if isinstance(value, int) else None


def _overlap_source(runner) -> str:
    backend = runner.backend
    if _uses_afd_roles(runner) and CAP_INSTRUMENTATION in backend.capabilities:
        return (
            "AFD step evidence of one instrumented run per case (overlap, bubble, straggler; "
            "straggler time needs two or more FFN ranks)"
        )
    return (
        f"run time of non-instrumented runs only: backend {backend.name!r} on {runner.topology} "
        f"does not run AFD roles apart with instrumentation ({CAP_AFD!r} + "
        f"{CAP_INSTRUMENTATION!r} and an AFD topology), so Attention/FFN overlap and FFN "
        "straggler time are not measured"
    )


def _annotate(measured, workloads, policies, runner) -> dict:
    """Add the cross-case correlation and the policy ranking to every result's evidence."""
    repetitions = {
        (w, p): measured[_case_name(w, p)].throughput_repetitions
        for w in workloads for p in policies
    }  # fmt: skip
    points = []
    for workload in workloads:
        baseline = measured[_case_name(workload, BASELINE_POLICY)].throughput
        for policy in policies:
            item = measured[_case_name(workload, policy)]
            point = {
                "workload": workload,
                "policy": policy,
                "imbalance": item.max_imbalance,
                # Same workload, so throughput ratio = inverse run-time ratio.
                "relative_run_time": baseline / item.throughput,
            }
            overlap = afd_overlap(item.instrumented.steps) if item.instrumented else None
            point.update(overlap or {})
            points.append(point)
    correlation = correlation_evidence(points)
    correlation["source"] = _overlap_source(runner)
    ranking = rank_policies(repetitions, seed=BOOTSTRAP_SEED)
    for item in measured.values():
        item.result["evidence"]["stage_a"] = {"correlation": correlation, "ranking": ranking}
        own = afd_overlap(item.instrumented.steps) if item.instrumented else None
        item.result["evidence"]["afd_overlap"] = own or absent(correlation["source"])
    return ranking


def afd_sequential_on(runner) -> bool:
    return bool(getattr(runner.options, "sequential", False))


def _check_matrix(runner, measured, workloads, policies, repetitions) -> None:
    """Headline sanity first; then, where the backend reports steps, the split evidence."""
    for name, item in measured.items():
        metrics = item.result["metrics"]
        requests = item.case.workload.num_requests
        assert metrics["failed_requests"] == 0, f"{name}: failed requests"
        # Sequential sessions measure each case until its comparisons stopped: its own count,
        # which the protocol records (and which is never below the first look).
        expected = item.result["protocol"]["repetitions"] if afd_sequential_on(runner) else repetitions
        assert expected >= repetitions and len(item.runs) == expected, name
        assert metrics["completed_requests"] == requests * expected, name
    runner.require_evidence(measured, "steps")
    for name, item in measured.items():
        tokens = item.result["evidence"]["tokens"]
        assert tokens["scheduled_real_tokens"] == item.case.workload.total_tokens, (
            f"{name}: scheduled {tokens['scheduled_real_tokens']} real tokens for a "
            f"{item.case.workload.total_tokens}-token workload without prefix caching"
        )
        ubatches = {len(step["ubatches"]) for step in item.representative.steps}
        if item.case.settings.split_policy == BASELINE_POLICY:
            assert ubatches == {1}, f"{name}: the unsplit baseline ran {ubatches} ubatches"
    for workload in workloads:
        if CONTROL_POLICY in policies and CANDIDATE_POLICY in policies:
            control = measured[_case_name(workload, CONTROL_POLICY)].max_imbalance
            candidate = measured[_case_name(workload, CANDIDATE_POLICY)].max_imbalance
            # A request-boundary cut is one of the cuts a token split may choose.
            assert candidate <= control, (
                f"{workload}: token-balanced imbalance {candidate} > request-boundary {control}"
            )


@pytest.mark.afd_deployments(*({"split_policy": policy, "cases": len(WORKLOADS)}
                               for policy in POLICIES))
@pytest.mark.parametrize(
    "size",
    [
        pytest.param("smallest", id="smallest"),
        pytest.param("stage", id="stage", marks=pytest.mark.slow),
    ],
)
def test_stage_a_policy_matrix(stage_runner, afd_options, pytestconfig, size):
    """Every policy on every Stage A workload, interleaved; one result per case."""
    cases = _matrix_cases(stage_runner, SIZES[size])
    measured = stage_runner.measure(cases, explain=True, write=False)
    ranking = _annotate(measured, WORKLOADS, POLICIES, stage_runner)
    stage_runner.write(measured)
    pytestconfig.stash[WINNER_KEY] = ranking["winner"]
    _check_matrix(stage_runner, measured, WORKLOADS, POLICIES, afd_options.repeats)
    long_short = {
        policy: measured[_case_name("long_short", policy)].max_imbalance
        for policy in (CONTROL_POLICY, CANDIDATE_POLICY)
    }
    # One long request holds most tokens: a boundary cut cannot balance it, a token cut can.
    assert long_short[CANDIDATE_POLICY] < long_short[CONTROL_POLICY], long_short


@pytest.mark.slow
@pytest.mark.afd_deployments(*({"split_policy": policy, "model": FULL_MODEL,
                                 "cases": len(FULL_MODEL_WORKLOADS)} for policy in POLICIES))
def test_stage_a_full_model_confirmation(stage_runner, afd_options, pytestconfig):
    """The winning and control policies again, on the full-depth model."""
    if afd_options.model == FULL_MODEL:
        pytest.skip("the session already runs the full model: the matrix is the full-model result")
    winner = pytestconfig.stash.get(WINNER_KEY, None)
    policies = confirmation_case_policies(winner)
    full = stage_runner.on(model_name=FULL_MODEL)
    cases = _matrix_cases(full, SIZES["smallest"], FULL_MODEL_WORKLOADS, policies)
    measured = full.measure(cases, explain=True, write=False)
    _annotate(measured, FULL_MODEL_WORKLOADS, policies, full)
    for item in measured.values():
        item.result["evidence"]["stage_a"]["reduced_model_winner"] = winner
    full.write(measured)
    layers = {_layer_count(item.result["manifest"]) for item in measured.values()}
    assert None not in layers, f"a full-model result reports no layer count: {layers}"
    session = with_served_facts(stage_runner.handle.manifest, stage_runner.backend)
    assert _layer_count(session) not in layers, (
        f"the full-model results embed the session model's layer count {layers}"
    )
    _check_matrix(full, measured, FULL_MODEL_WORKLOADS, policies, afd_options.repeats)
