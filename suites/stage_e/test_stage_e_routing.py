"""Stage E: full layers and natural expert routing (RFC "Experiment matrix", Stage E).

The RFC's four diagnostic pairs: reduced/full depth x forced-balanced/natural
routing. Natural routing keeps the router's expert ids; every result records
per-layer expert heat and EP-rank skew (max/mean, coefficient of variation) and
the per-step correlation of the straggler EP rank's load with the step's
critical-path time (or the reason it is absent). Forced-balanced results are labelled
synthetic (performance only, never an accuracy claim). A backend without
forced routing runs the natural cases and skips the forced ones with the reason.
Under ``--afd-study`` with references the study's reference workload and policy
replace trace_conv / token_balanced (suites/stage_study.py).
"""

from __future__ import annotations

import pytest
from stage_e_heat import critical_path_correlation, heat_summary
from stage_study import reference_evidence, study_reference

from pytest_afd.core.backend import CAP_FORCED_ROUTING
from pytest_afd.results.manifest import absent

pytestmark = [pytest.mark.stage_e, pytest.mark.slow]

DEPTHS = ("reduced", "full")
ROUTINGS = ("natural", "forced_balanced")
WORKLOAD = "trace_conv"  # production-like lengths from the Azure conversation trace
POLICY = "token_balanced"
# Multiplier on the stage scale: the full model is ~6x the reduced one's cost.
SIZE = 0.5


def _deployments(context):
    depth = context.item.callspec.params["depth"]
    reference = study_reference(context.options)
    policy = reference.policy if reference else POLICY
    return [{"split_policy": policy, "routing": routing, "model": depth} for routing in ROUTINGS]


@pytest.mark.afd_deployments.with_args(_deployments)
@pytest.mark.parametrize("depth", DEPTHS)
def test_stage_e_depth_x_routing(stage_runner, depth):
    reference = study_reference(stage_runner.options)
    policy = reference.policy if reference else POLICY
    runner = stage_runner.on(model_name=depth)
    workload = runner.workload(reference.workload if reference else WORKLOAD,
                               scale=runner.sizes.scale * SIZE)
    forced_supported = CAP_FORCED_ROUTING in runner.backend.capabilities
    routings = ROUTINGS if forced_supported else ("natural",)
    cases = [
        runner.case(
            name=f"{depth}/{routing}",
            workload=workload,
            settings=runner.settings(split_policy=policy, routing=routing),
            evidence=reference_evidence(reference),
            notes="synthetic: forced-balanced routing, performance only (no accuracy claim)"
            if routing == "forced_balanced"
            else None,
        )
        for routing in routings
    ]
    measured = runner.measure(cases, write=False)
    for item in measured.values():
        evidence = item.result["evidence"]
        load = evidence["expert_load"]
        evidence["expert_heat"] = (
            heat_summary(load["per_expert"], load["per_rank"])
            if item.has_expert_load
            else absent("the backend reported no expert load")
        )
        # RFC: how the straggler EP rank's load tracks the critical path, step by step.
        evidence["expert_critical_path"] = (
            critical_path_correlation(evidence["steps"])
            if isinstance(evidence["steps"], list)
            else absent("the backend reported no per-step evidence")
        )
    runner.write(measured)
    for name, item in measured.items():
        forced = item.case.settings.routing == "forced_balanced"
        assert item.result["labels"]["synthetic"] is forced, name
        assert item.result["manifest"]["model"]["name"] == depth, name
        assert item.result["metrics"]["failed_requests"] == 0, name
    runner.require_evidence(measured, "expert_load")
    for name, item in measured.items():
        load = item.result["evidence"]["expert_load"]
        assert load["routing"] == item.case.settings.routing, name
        assert load["per_expert"], f"{name}: no MoE layer reported routed tokens"
    if not forced_supported:
        pytest.skip(
            f"natural routing measured; forced-balanced skipped: backend "
            f"{runner.backend.name!r} does not declare {CAP_FORCED_ROUTING!r}"
        )
    natural = measured[f"{depth}/natural"].result["evidence"]["expert_heat"]
    forced = measured[f"{depth}/forced_balanced"].result["evidence"]["expert_heat"]
    assert forced["worst_expert_max_over_mean"] <= natural["worst_expert_max_over_mean"], (
        f"forced-balanced routing is hotter than natural: {forced} vs {natural}"
    )
