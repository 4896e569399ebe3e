"""Stage C: workload/request imbalance (RFC "Experiment matrix", Stage C).

Deterministic datasets with the same total logical prompt tokens: uniform,
narrow production-like, bimodal, heavy-tailed, trace-derived (Azure LLM 2023
conversation trace, CC-BY-4.0) and adversarial ordering (long requests
clustered on one side). Each in fixed and shuffled order, so scheduler ordering
is not confused with the distribution, under request-boundary and
token-balanced splitting. Every result records the dataset's mean,
percentiles, standard deviation, CV, min/max, total and content hash. Under
``--afd-study`` with references the distribution is the factor varied, so the
study's reference workload joins the matrix (when it is not one of them) and
every case records where its reference came from (suites/stage_study.py).
"""

from __future__ import annotations

from collections import Counter

import pytest
from stage_study import reference_evidence, study_reference

from pytest_afd.workloads import ORDERS

pytestmark = [pytest.mark.stage_c, pytest.mark.slow]

DISTRIBUTIONS = ("uniform", "narrow", "bimodal", "heavy_tailed", "trace_conv", "adversarial")
POLICIES = ("request_boundary", "token_balanced")
STATISTICS = ("mean", "p50", "p90", "p99", "std", "cv", "min", "max", "total")


@pytest.mark.afd_deployments(*({"split_policy": policy} for policy in POLICIES))
def test_stage_c_distribution_matrix(stage_runner):
    reference = study_reference(stage_runner.options)
    distributions = DISTRIBUTIONS + tuple(
        [reference.workload] if reference and reference.workload not in DISTRIBUTIONS else [])
    workloads = {
        (name, order): stage_runner.workload(name, order=order)
        for name in distributions
        for order in ORDERS
    }
    totals = {key: workload.total_tokens for key, workload in workloads.items()}
    assert len(set(totals.values())) == 1, f"total logical tokens differ: {totals}"
    for name in distributions:
        fixed, shuffled = workloads[(name, "fixed")], workloads[(name, "shuffled")]
        # Shuffled is a permutation of the same prompts, not another sample.
        assert Counter(fixed.prompt_lengths) == Counter(shuffled.prompt_lengths), name
    cases = [
        stage_runner.case(
            name=f"{name}/{order}/{policy}",
            workload=workload,
            settings=stage_runner.settings(split_policy=policy),
            evidence=reference_evidence(reference),
        )
        for (name, order), workload in workloads.items()
        for policy in POLICIES
    ]
    measured = stage_runner.measure(cases)
    for case_name, item in measured.items():
        workload_doc = item.result["workload"]
        assert set(STATISTICS) <= set(workload_doc["stats"]), case_name
        assert workload_doc["dataset"]["digest"] == item.case.workload.content_hash
        assert item.result["metrics"]["failed_requests"] == 0, case_name
    stage_runner.require_evidence(measured, "steps")
    for name in distributions:
        for order in ORDERS:
            control = measured[f"{name}/{order}/request_boundary"].max_imbalance
            candidate = measured[f"{name}/{order}/token_balanced"].max_imbalance
            assert candidate <= control, f"{name}/{order}: {candidate} > {control}"
    # Long requests clustered on one side: a boundary cut is far from the middle.
    adversarial = measured["adversarial/fixed/request_boundary"].max_imbalance
    assert adversarial > measured["adversarial/fixed/token_balanced"].max_imbalance
