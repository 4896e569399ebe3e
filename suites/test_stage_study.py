"""Unit tests of suites/stage_study.py (no backend): which reference the stages get."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from stage_study import EVIDENCE_KEY, reference_evidence, study_reference

DIGEST = "sha256:" + "a" * 64


def _options(references):
    study = {"name": "s", "digest": DIGEST, "references": references}
    return SimpleNamespace(study=study)


def _references(workload="uniform", chunks=None):
    return {"reference": {"workload": workload, "policy": "token_balanced",
                          "control_policy": "request_boundary", "case_ids": [],
                          "reason": "no stable workload" if workload is None else "lowest CV"},
            "chunks": chunks}


def test_stage_study_without_study_or_references_keeps_the_defaults():
    assert study_reference(SimpleNamespace(study=None)) is None
    assert study_reference(_options(None)) is None
    assert reference_evidence(None) == {}


def test_stage_study_reference_and_frozen_chunks():
    reference = study_reference(_options(_references(chunks={
        "logical_chunk_sizes": [16384, 32768], "case_ids": [], "reason": "fastest"})))
    assert (reference.workload, reference.policy, reference.control_policy) == (
        "uniform", "token_balanced", "request_boundary")
    assert reference.logical_chunk_sizes == (16384, 32768)
    assert reference_evidence(reference)[EVIDENCE_KEY]["study"] == f"s {DIGEST}"
    assert study_reference(_options(_references())).logical_chunk_sizes is None


def test_stage_study_without_a_stable_reference_fails_before_measuring():
    with pytest.raises(pytest.fail.Exception, match=r"found no stable reference \(no stable "
                                                    r"workload\); stages B-E have no reference"):
        study_reference(_options(_references(workload=None)))
