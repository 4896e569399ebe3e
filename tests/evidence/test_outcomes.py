"""Results carry the test outcome and the session id; summary.json is always replaced; 0644; finite."""

from __future__ import annotations

import copy
import json
import math
import stat

import pytest

from pytest_afd.results import documents as results
from tests.support.forked_pytest import runpytest_forked
from tests.support.inner_pytest import UNRELATED_PLUGINS

pytest_plugins = ["pytester"]

CONFTEST = """
import pytest
from pytest_afd.core.backend import RequestOutput, RunOutputs, PromptRequest
from pytest_afd.results import documents as results


class FakeBackend:
    name = "fake"
    capabilities = frozenset()

    def run(self, prompts, settings):
        return RunOutputs(
            requests=[RequestOutput(p.request_id, p.num_prompt_tokens, 0, 1, ttft_s=0.01) for p in prompts],
            steps=[{"policy": settings.split_policy, "split_token": None, "imbalance": None,
                    "ubatches": [{"num_real_tokens": 8, "num_padded_tokens": 0}]}],
            expert_load=[[4] * 8], wall_time_s=0.5)

    def reset_prefix_cache(self):
        pass

    def describe(self):
        return {"model": {"num_layers": 2}}

    def close(self):
        pass


def pytest_afd_create_backend(config, name, topology, model_name, seed, results_dir):
    return FakeBackend()


@pytest.fixture
def record_case(afd_backend, afd_options, afd_results, npu_topology):
    def record():
        settings = afd_options.run_settings()
        outputs = [afd_backend.run([PromptRequest("a", tuple(range(8)))], settings)
                   for _ in range(afd_options.repeats)]
        return afd_results.record(
            settings=settings,
            workload=results.workload_json(dataset_name="fixed", prompt_lengths=[8], seed=None),
            metrics=results.metrics_from_runs(outputs),
            evidence=results.evidence_from_outputs(outputs[0], routing=settings.routing,
                                                   num_ep_ranks=npu_topology.num_ep_ranks),
        )
    return record


@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown broke")
"""

CASES = """
import pytest

def test_passes(record_case):
    record_case()

def test_fails(record_case):
    record_case()
    assert False, "verdict after the evidence"

def test_skips(record_case):
    record_case()
    pytest.skip("no NPU for this one")

def test_teardown_error(record_case, broken_teardown):
    record_case()

@pytest.mark.xfail(reason="known split bug", strict=True)
def test_xfails(record_case):
    record_case()
    assert False
"""

FAST = ("-p", "no:unraisableexception", "-p", "no:cacheprovider", *UNRELATED_PLUGINS)


@pytest.fixture
def fake(pytester, monkeypatch):
    for name in ("AFD_NPU_TOPOLOGY", "AFD_BACKEND", "AFD_RESULTS_DIR", "AFD_REPEATS",
                 "AFD_CPU_PROCESSES", "PYTEST_AFD_FAULT"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(CONFTEST)
    return pytester


def load_results(directory):
    docs = {}
    for path in directory.glob("*.json"):
        if path.name != "summary.json":
            doc = json.loads(path.read_text())
            docs[doc["case_id"].split("::")[-1]] = (doc, path)
    return docs


def test_each_result_records_its_outcome_and_session(fake):
    fake.makepyfile(test_cases=CASES)
    result = fake.runpytest(*FAST)
    result.assert_outcomes(passed=2, failed=1, skipped=1, errors=1, xfailed=1)
    out = fake.path / "afd-results"
    docs = load_results(out)
    outcomes = {name: doc["outcome"] for name, (doc, _) in docs.items()}
    assert outcomes["test_passes"] == {"status": "passed", "reason": None}
    assert outcomes["test_fails"]["status"] == "failed"
    assert "verdict after the evidence" in outcomes["test_fails"]["reason"]
    assert outcomes["test_skips"] == {"status": "skipped", "reason": "no NPU for this one"}
    assert outcomes["test_teardown_error"]["status"] == "error"
    assert "teardown" in outcomes["test_teardown_error"]["reason"]
    assert outcomes["test_xfails"] == {"status": "skipped", "reason": "xfail: known split bug"}
    sessions = {doc["session_id"] for doc, _ in docs.values()}
    summary = json.loads((out / "summary.json").read_text())
    assert sessions == {summary["session_id"]}
    assert {e["outcome"] for e in summary["results"]} == {"passed", "failed", "skipped", "error"}
    for doc, path in docs.values():
        results.validate_result(doc)
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    # A second session gets another id.
    fake.runpytest(*FAST, "-k", "passes")
    again = json.loads((out / "summary.json").read_text())
    assert again["session_id"] != summary["session_id"]


def test_an_afd_session_that_writes_nothing_replaces_summary(fake):
    out = fake.path / "afd-results"
    out.mkdir()
    stale = json.dumps({"results": [{"case_id": "stale"}]})
    (out / "summary.json").write_text(stale)
    # No AFD case selected (a plain test): the last summary stays (test_plugin_no_case_selected).
    fake.makepyfile(test_nothing="def test_plain():\n    pass\n")
    fake.runpytest(*FAST).assert_outcomes(passed=1)
    assert (out / "summary.json").read_text() == stale
    # A gate case ran and wrote nothing: its session's (empty) summary replaces the last.
    fake.makepyfile(test_nothing="import pytest\n\n@pytest.mark.gate\n"
                                 "def test_plain():\n    pass\n")
    fake.runpytest(*FAST).assert_outcomes(passed=1)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["results"] == [] and summary["session_id"]


def test_xdist_workers_share_the_session_id(fork_server, fake):
    fake.makepyfile(test_many="import pytest\n\n@pytest.mark.parametrize('n', range(4))\n"
                              "def test_case(record_case, n):\n    record_case()\n")
    result = runpytest_forked(fork_server, fake, *FAST, "-n", "2", "-p", "xdist")
    result.assert_outcomes(passed=4)
    out = fake.path / "afd-results"
    docs = load_results(out)
    summary = json.loads((out / "summary.json").read_text())
    assert len(docs) == 4
    assert {doc["session_id"] for doc, _ in docs.values()} == {summary["session_id"]}
    assert {doc["outcome"]["status"] for doc, _ in docs.values()} == {"passed"}


@pytest.fixture
def valid_doc():
    run = {"unit": "tokens/s", "repetitions": [1.0, 2.0, 3.0],
           "stats": {"n": 3, "median": 2.0, "min": 1.0, "max": 3.0, "mean": 2.0, "stddev": 1.0,
                     "iqr": 1.0, "cv": 0.5}}
    return run


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused(bad, tmp_path):
    doc = {"a": [1.0, {"b": bad}]}
    assert results.non_finite_paths(doc) == ["/a/1/b"]
    with pytest.raises(results.ResultValidationError, match="non-finite"):
        results.validate_manifest({"kind": bad})


def test_negative_rates_are_refused_by_the_schema(valid_doc):
    from jsonschema import Draft202012Validator

    defs = results.load_schema(results.RESULT_SCHEMA_FILE)["$defs"]
    check = Draft202012Validator({"$defs": defs, "$ref": "#/$defs/measurement"})
    metric = copy.deepcopy(valid_doc)
    assert not list(check.iter_errors(metric))
    metric["repetitions"][0] = -1.0
    metric["stats"]["min"] = -1.0
    assert len(list(check.iter_errors(metric))) == 2
    counts = Draft202012Validator({"$defs": defs, "$ref": "#/$defs/count_or_absent"})
    assert list(counts.iter_errors(-3)) and not list(counts.iter_errors(3))
