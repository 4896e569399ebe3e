"""Stages B-E under ``--afd-study``: the reference configuration Stage A selected (docs/study.md).

Without a study, or with a study that has no references yet (it was just
frozen, Stage A has not been selected from), every stage keeps its own
defaults. With references, the stages use the study's reference workload and
policy pair, and Stage D its frozen best two chunk sizes, so two sessions of
one study measure the same cases. A study whose selection found no stable
reference fails the stage before it measures: its cases would not be the
study's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

EVIDENCE_KEY = "study_reference"


@dataclass(frozen=True)
class StudyReference:
    workload: str
    policy: str
    control_policy: str
    # Stage D's follow-up sizes in logical (full-scale) tokens; None: the session's own best two.
    logical_chunk_sizes: tuple[int, ...] | None
    study: str  # "<name> <digest>"

    def evidence(self) -> dict[str, Any]:
        return {"study": self.study, "workload": self.workload, "policy": self.policy,
                "control_policy": self.control_policy,
                "logical_chunk_sizes": None if self.logical_chunk_sizes is None
                else list(self.logical_chunk_sizes)}


def study_reference(options: Any) -> StudyReference | None:
    """The study's reference configuration, None without one (the stages' defaults)."""
    study: Mapping[str, Any] | None = getattr(options, "study", None)
    if study is None or study.get("references") is None:
        return None
    references = study["references"]
    reference = references["reference"]
    label = f"{study['name']} {study['digest']}"
    if reference["workload"] is None:
        pytest.fail(f"--afd-study {label}: its Stage A selection found no stable reference "
                    f"({reference['reason']}); stages B-E have no reference to use. Rerun Stage "
                    "A and select-references again", pytrace=False)
    chunks = references.get("chunks")
    return StudyReference(
        workload=reference["workload"], policy=reference["policy"],
        control_policy=reference["control_policy"],
        logical_chunk_sizes=None if chunks is None else tuple(chunks["logical_chunk_sizes"]),
        study=label,
    )


def reference_evidence(reference: StudyReference | None) -> dict[str, Any]:
    """What each case records about where its workload and policy came from."""
    return {} if reference is None else {EVIDENCE_KEY: reference.evidence()}
