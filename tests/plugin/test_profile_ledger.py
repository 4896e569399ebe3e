"""A profiled session that produced no profile does not pass quietly (issue 45): the count of
instrumented cases with a profile is the first verdict line and a summary.json block, the
session fails under --afd-profile when none has one, and a partial loss names the cases."""

from __future__ import annotations

import json

from pytest_afd.results.profile_ledger import ProfileCount, count_docs, status_of
from tests.support.plugin_pytester import FAKE_CONFTEST, run_fast

pytest_plugins = ["pytester"]

LOST = "no trace files were written under /tmp/afd-traces-x: no rank's profiler exported a trace"
OTHER = "the trace analysis raised ValueError: parse error in trace 'x'"
PRESENT = {"source": "torch_trace"}

# Each inner case records a result whose evidence.profile is absent with LOST (the CPU
# backend's record of an instrumented run whose ranks wrote no trace).
CASES = f'''
import pytest
from pytest_afd.results import documents as results
from pytest_afd.core.backend import PromptRequest
from pytest_afd.results.manifest import absent


@pytest.fixture
def record_lost(afd_backend, afd_options, afd_results, npu_topology):
    settings = afd_options.run_settings()
    prompts = [PromptRequest("a", tuple(range(40)))]
    outputs = [afd_backend.run(prompts, settings)]
    evidence = results.evidence_from_outputs(outputs[0], routing=settings.routing,
                                             num_ep_ranks=npu_topology.num_ep_ranks)
    evidence["profile"] = absent({LOST!r})
    return afd_results.record(
        settings=settings,
        workload=results.workload_json(dataset_name="fixed", prompt_lengths=[40], seed=None),
        metrics=results.metrics_from_runs(outputs), evidence=evidence)


@pytest.mark.stage_a
@pytest.mark.parametrize("n", [1, 2])
def test_instrumented(record_lost, n):
    pass
'''


def session(pytester, *flags):
    pytester.makeconftest(FAKE_CONFTEST)
    pytester.makepyfile(test_cases=CASES)
    results = pytester.path / "res"
    ran = run_fast(pytester, "-m", "stage_a", "--afd-results-dir", str(results), *flags)
    return ran, json.loads((results / "summary.json").read_text())


def test_every_profile_lost_under_afd_profile_fails_the_session(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_CLOSED_FILE", str(tmp_path / "closed"))
    ran, summary = session(pytester, "--afd-profile")
    ran.assert_outcomes(passed=2)
    assert ran.ret == 1  # the tests passed; the session did not
    ran.stdout.fnmatch_lines([
        "verdicts (*",
        f"  profiles: 0 of 2 instrumented cases; most common reason (2 of 2 lost): {LOST}; "
        "--afd-profile: no profile came back, failing the session",
    ])
    block = summary["profiles"]
    assert block["requested"] and block["fails_session"]
    assert (block["instrumented_cases"], block["cases_with_profile"]) == (2, 0)
    assert block["most_common_reason"] == LOST
    assert [entry["absent_reason"] for entry in block["lost"]] == [LOST, LOST]
    assert all(entry["profile"] == {"present": False, "absent_reason": LOST}
               for entry in summary["results"])


def test_the_same_loss_without_afd_profile_is_counted_but_does_not_fail(pytester, monkeypatch,
                                                                       tmp_path):
    monkeypatch.setenv("FAKE_CLOSED_FILE", str(tmp_path / "closed"))
    ran, summary = session(pytester)
    assert ran.ret == 0
    ran.stdout.fnmatch_lines(["  profiles: 0 of 2 instrumented cases; most common reason*"])
    assert summary["profiles"]["fails_session"] is False


def test_a_partial_loss_is_a_warning_naming_the_cases():
    count = ProfileCount.of([("a", {"present": True, "absent_reason": None}),
                             ("b", {"present": False, "absent_reason": LOST}),
                             ("c", {"present": False, "absent_reason": OTHER}),
                             ("d", {"present": False, "absent_reason": LOST}),
                             ("e", None)])  # not instrumented
    assert count.instrumented == 4
    assert not count.fails(requested=True)
    assert count.line(requested=True) == (
        f"profiles: 1 of 4 instrumented cases; most common reason (2 of 3 lost): {LOST}")
    assert count.warning() == "3 instrumented case(s) have no profile: b, c, d"
    assert ProfileCount.of([("a", {"present": True, "absent_reason": None})]).warning() is None


def test_the_report_counts_from_result_documents():
    docs = [{"case_id": "a", "evidence": {"profile": PRESENT}},
            {"case_id": "b", "evidence": {"profile": {"value": None, "absent_reason": LOST}}},
            {"case_id": "c", "evidence": {}}]
    assert status_of(docs[2]) is None
    count = count_docs(docs)
    assert (count.with_profile, count.lost) == (["a"], {"b": LOST})
