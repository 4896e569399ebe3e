"""The whole study on CPU, end to end (slow; nightly): freeze, gates, Stage A in two sessions,
reference selection, stages B-E under the referenced study, Stage D again with the frozen best
two chunk sizes, Stage F, and publish (docs/study.md), on the CPU backend in-process.

The steps are the shared sequence of study_sequence.py (the commands a person runs, each in
its own process). The checks are on what the steps wrote: every case records the study it
ran under, stages B-E ran the reference configuration, Stage D's follow-ups ran the study's
sizes, and the bundle's regions agree with its own tables. The same sequence through the CPU
deploy command is test_study_deploy_command.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_afd.study.bundle_check import bundle_problems
from tests.study.study_sequence import StudyRun, base_env, results

pytestmark = pytest.mark.slow

SCALE = 1 / 64


def check_references(run: dict) -> dict:
    """The referenced study derives from the frozen one, over two sessions, with a reference."""
    child = run["referenced"]
    references = child["references"]
    assert child["parent_digest"] == run["frozen"]["digest"] and len(references["sessions"]) == 2
    assert references["reference"]["workload"] is not None and references["selected"]
    return references["reference"]


def check_stages_b_e(run: dict) -> None:
    """Every B-E case records the referenced study; the swept ones ran its reference."""
    reference = check_references(run)
    later = results(run["later"])
    for doc in later:
        assert doc["manifest"]["study"]["digest"] == run["referenced"]["digest"], doc["case_id"]
        used = doc["evidence"].get("study_reference")
        # Stage D's follow-ups vary the workload on purpose (balanced, imbalanced).
        swept = doc["case_kind"] in ("stage_b", "stage_e") or "/sweep/" in doc["case_id"]
        if swept and used is not None:
            assert doc["workload"]["spec"]["distribution"] == reference["workload"], doc["case_id"]
            assert doc["settings"]["split_policy"] in (reference["policy"],
                                                       reference["control_policy"])
    kinds = {doc["case_kind"] for doc in later if "study_reference" in doc["evidence"]}
    assert kinds == {"stage_b", "stage_c", "stage_d", "stage_e"}


def check_stage_d_sizes(run: dict) -> None:
    """Stage D's follow-ups ran the best two sizes frozen into the study (at the stage scale)."""
    sizes = run["chunked"]["references"]["chunks"]["logical_chunk_sizes"]
    follow_ups = [d for d in results(run["again"]) if "/best/" in d["case_id"]]
    assert follow_ups and all(d["evidence"]["stage_d_best_sizes_source"].startswith("the study")
                              for d in follow_ups)
    assert follow_ups[0]["evidence"]["stage_d_best_sizes"] == [round(s * SCALE) for s in sizes]


def check_bundle(run: dict) -> dict:
    """Every result records a study; the bundle agrees with itself and is diagnostic only."""
    for directory in run["every"]:
        assert all("study" in doc["manifest"] for doc in results(directory)), directory
    bundle: Path = run["bundle"]
    assert (bundle / "regions.json").is_file() and (bundle / "study.html").is_file()
    assert bundle_problems(bundle) == []  # schema, checksums, regions vs own tables, first line
    regions = json.loads((bundle / "regions.json").read_text())
    assert regions["production_recommendation"] is False  # CPU, reduced layers: diagnostic
    return regions


def test_study_end_to_end_on_cpu(tmp_path):
    sequence = StudyRun(tmp_path, base_env(tmp_path, AFD_BACKEND="cpu"))
    run = sequence.whole("cpu-rehearsal")
    assert set(run["frozen"]["launch_commands"]) == {"attention.node0", "attention.node1", "ffn",
                                                     "baseline.node0", "baseline.node1"}
    check_stages_b_e(run)
    check_stage_d_sizes(run)
    check_bundle(run)
