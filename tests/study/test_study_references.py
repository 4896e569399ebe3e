"""select-references: planted stable and unstable Stage A cases are told apart, with reasons."""

import pytest

from pytest_afd.study.document import StudyError, derive, seal
from pytest_afd.study.references import MAX_CV, MAX_SESSION_DIFFERENCE, cv, select
from tests.study.study_helpers import cpu_manifest, freeze

NODE = "suites/stage_a/test_stage_a_policies.py::test_stage_a_policy_matrix[stage]"
STABLE = (100.0, 101.0, 99.0)  # CV 0.01
NOISY = (100.0, 140.0, 70.0)  # CV 0.34


def _doc(session, workload, policy, reps, manifest, *, kind="stage_a", winner=None, chunk=None,
         case=None, status="passed"):
    return {
        "case_kind": kind, "session_id": session, "created_at": f"2026-12-0{session[-1]}T00:00:00Z",
        "case_id": case or f"{NODE}/{workload}/{policy}",
        "settings": {"split_policy": policy,
                     "chunked_prefill": {"enabled": chunk is not None, "chunk_size": chunk},
                     "stage_sizes": {"scale": 1 / 64}},
        "workload": {"dataset": {"name": f"{workload}-fixed"}, "spec": {"distribution": workload}},
        "metrics": {"prefill_tokens_per_s": {"repetitions": list(reps)}},
        "outcome": {"status": status}, "manifest": manifest,
        "evidence": {"stage_a": {"ranking": {"winner": winner}}},
    }


def _two_sessions(manifest, shifted=1.0, winner=None):
    docs = []
    for session, factor in (("s1", 1.0), ("s2", shifted)):
        for workload, noise in (("uniform", STABLE), ("bimodal", STABLE), ("long_short", NOISY)):
            for policy in ("none", "request_boundary", "token_balanced"):
                reps = [v * factor for v in noise] if workload == "bimodal" else noise
                docs.append(_doc(session, workload, policy, reps, manifest, winner=winner))
    return docs


@pytest.fixture
def study(tmp_path):
    return freeze(tmp_path)


def test_references_stable_cases_selected_unstable_rejected_with_reasons(study):
    references = select(study, _two_sessions(cpu_manifest(), shifted=1.2))
    selected = {c["case_id"].split("]/")[1] for c in references["selected"]}
    assert selected == {"uniform/none", "uniform/request_boundary", "uniform/token_balanced"}
    reasons = {r["case_id"].split("]/")[1]: r["reason"] for r in references["rejected"]}
    assert reasons["long_short/token_balanced"] == f"repetition CV 0.340 > {MAX_CV}"
    assert reasons["bimodal/token_balanced"] == (
        f"session-to-session difference 0.182 > {MAX_SESSION_DIFFERENCE}")
    case = references["selected"][0]
    assert case["sessions"] == 2 and case["repetitions"] == 3
    assert case["median_tokens_per_s"] == 100.0 and case["cv"] == pytest.approx(cv(STABLE))
    assert references["sessions"] == ["s1", "s2"]
    reference = references["reference"]
    assert (reference["workload"], reference["policy"]) == ("uniform", "token_balanced")
    assert "no policy won Stage A in every session" in reference["reason"]
    assert references["criterion"]["max_cv"] == MAX_CV


def test_references_winner_of_every_session_is_the_reference_policy(study):
    docs = _two_sessions(cpu_manifest(), winner="request_boundary")
    reference = select(study, docs)["reference"]
    assert (reference["policy"], reference["control_policy"]) == ("request_boundary",
                                                                  "token_balanced")
    docs[0]["evidence"]["stage_a"]["ranking"]["winner"] = "token_balanced"  # s1 disagrees
    assert select(study, docs)["reference"]["policy"] == "token_balanced"


def test_references_one_session_says_the_between_session_test_was_not_applied(study):
    docs = [d for d in _two_sessions(cpu_manifest()) if d["session_id"] == "s1"]
    references = select(study, docs)
    assert "one session" in references["criterion"]["text"]
    assert all(c["session_difference"] is None for c in references["selected"])


def test_references_reject_contradicting_missing_and_short_cases(study):
    docs = _two_sessions(cpu_manifest())
    other = cpu_manifest(environ={"AFD_PLUGIN_COMMIT": "cafef00d"})
    pinned = derive(study, stack={**study["stack"], "afd_plugin": "deadbeef"})
    docs = [d for d in docs if not (d["session_id"] == "s2" and "bimodal/none" in d["case_id"])]
    docs += [_doc("s2", "extra", "none", STABLE[:2], cpu_manifest())]
    docs += [_doc("s1", "extra", "none", STABLE, cpu_manifest())]
    reasons = {r["case_id"].split("]/")[1]: r["reason"] for r in select(study, docs)["rejected"]}
    assert reasons["bimodal/none"] == "measured in 1 of 2 sessions"
    assert reasons["extra/none"].startswith("2 repetition(s) in session s2")
    contradicted = select(pinned, [*docs[:3], _doc("s1", "x", "none", STABLE, other)])
    reason = contradicted["rejected"][-1]["reason"]
    assert reason.startswith("contradicts the frozen study: stack.afd_plugin: study 'deadbeef', "
                             "run 'cafef00d'")


def test_references_stage_d_sweep_freezes_the_best_two_chunk_sizes(study):
    docs = _two_sessions(cpu_manifest())
    for session in ("s1", "s2"):
        for chunk, speed in ((128, 90.0), (256, 120.0), (512, 110.0), (1024, 130.0)):
            noise = NOISY if chunk == 1024 else STABLE  # the fastest one is unstable
            docs.append(_doc(session, "bimodal", "token_balanced", [v * speed / 100 for v in noise],
                             cpu_manifest(), kind="stage_d", chunk=chunk,
                             case=f"suites/stage_d/t.py::t/sweep/bimodal/chunk{chunk}"))
    chunks = select(study, docs)["chunks"]
    assert chunks["logical_chunk_sizes"] == [256 * 64, 512 * 64]
    assert select(study, _two_sessions(cpu_manifest()))["chunks"] is None


def test_references_need_stage_a_results(study):
    with pytest.raises(StudyError, match="no Stage A result"):
        select(study, [])
    # The selection is a valid study field.
    seal({**study, "references": select(study, _two_sessions(cpu_manifest()))})
