"""Stage B: prefix-cache hit ratio (RFC "Experiment matrix", Stage B).

Requested hit ratios 0/25/50/75/90 % (90 % falls back to the highest ratio the
workload can realise, with the reason recorded), each measured in a cold phase
(cache dropped before every run) and a steady-state phase (cache dropped, then
the shared prefix seeded by one prompt, before every run). The realized ratio
comes from the runtime's per-request cached tokens, never from how the input
was built; logical prompt tokens and newly scheduled tokens are both recorded.
Token-balanced runs the whole sweep; request-boundary joins it at the extreme
and midpoint ratios to see whether cache hits change the preferred split. Under
``--afd-study`` with references, the study's reference workload and policy pair
replace bimodal / token_balanced / request_boundary (suites/stage_study.py).
"""

from __future__ import annotations

import pytest
from stage_b_ratios import ratio_label, realizable_ratios
from stage_study import reference_evidence, study_reference

from pytest_afd.workloads import STAGE_B_HIT_RATIOS

pytestmark = [pytest.mark.stage_b, pytest.mark.slow]

# Bimodal lengths: the unique suffixes keep a shape the split has to balance.
DISTRIBUTION = "bimodal"
SWEEP_POLICY = "token_balanced"
CONTROL_POLICY = "request_boundary"
PHASES = ("cold", "steady")


def _cases(stage_runner, workloads, notes, sweep_policy, control_policy, evidence):
    ratios = sorted(workloads)
    control_ratios = {ratios[0], ratios[len(ratios) // 2], ratios[-1]}
    cases = []
    for ratio in ratios:
        policies = (sweep_policy, control_policy) if ratio in control_ratios else (sweep_policy,)
        for policy in policies:
            for phase in PHASES:
                cases.append(
                    stage_runner.case(
                        name=f"{ratio_label(ratio)}/{phase}/{policy}",
                        workload=workloads[ratio],
                        settings=stage_runner.settings(split_policy=policy, prefix_caching=True),
                        phase=phase,
                        notes=notes.get(ratio),
                        evidence=dict(evidence),
                    )
                )
    return cases


@pytest.mark.afd_deployments(
    *({"split_policy": policy, "prefix_caching": True} for policy in (SWEEP_POLICY, CONTROL_POLICY))
)
def test_stage_b_hit_ratio_sweep(stage_runner):
    reference = study_reference(stage_runner.options)
    distribution = reference.workload if reference else DISTRIBUTION
    sweep_policy = reference.policy if reference else SWEEP_POLICY
    control_policy = reference.control_policy if reference else CONTROL_POLICY
    workloads, notes = realizable_ratios(
        lambda ratio: stage_runner.workload(distribution, requested_hit_ratio=ratio),
        STAGE_B_HIT_RATIOS,
    )
    measured = stage_runner.measure(_cases(stage_runner, workloads, notes, sweep_policy,
                                           control_policy, reference_evidence(reference)))
    for name, item in measured.items():
        assert item.result["metrics"]["failed_requests"] == 0, name
    for ratio in workloads:
        label = ratio_label(ratio)
        cold = measured[f"{label}/cold/{sweep_policy}"].realized_hit_ratio
        steady = measured[f"{label}/steady/{sweep_policy}"].realized_hit_ratio
        assert steady >= cold, f"{label}: steady-state hit ratio {steady} < cold {cold}"
        if ratio > 0:
            assert steady > 0, f"{label}: the runtime reported no cache hit in the steady phase"
    stage_runner.require_evidence(measured, "steps")
    for name, item in measured.items():
        evidence = item.result["evidence"]
        tokens, prefix = evidence["tokens"], evidence["prefix_cache"]
        assert tokens["logical_prompt_tokens"] == item.case.workload.total_tokens, name
        assert tokens["scheduled_real_tokens"] == prefix["computed_tokens"], (
            f"{name}: newly scheduled tokens {tokens['scheduled_real_tokens']} != logical - hits "
            f"{prefix['computed_tokens']}"
        )
