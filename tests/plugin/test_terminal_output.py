"""The terminal summary reads: gate-style cases as outcomes per test (no rows of empty figures),
CV in percent as in the report, and a session the plugin failed ends with the reason."""

from __future__ import annotations

import pytest

from pytest_afd.terminal import format_cv, measured_rows, outcome_rows
from tests.support.plugin_pytester import run_fast

pytest_plugins = ["pytester"]

GATE_AND_STAGE = """
import pytest
from pytest_afd import results


def write(afd_options, afd_results, afd_backend, npu_topology, metrics):
    from pytest_afd.backends.base import PromptRequest

    settings = afd_options.run_settings()
    prompts = [PromptRequest("a", tuple(range(40)))]
    outputs = afd_backend.run(prompts, settings)
    afd_results.record(
        settings=settings,
        workload=results.workload_json(dataset_name="fixed", prompt_lengths=[40], seed=None),
        metrics=metrics([outputs]),
        evidence=results.evidence_from_outputs(outputs, routing=settings.routing,
                                               num_ep_ranks=npu_topology.num_ep_ranks))


@pytest.mark.gate
@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_gate_like(afd_options, afd_results, afd_backend, npu_topology, n):
    write(afd_options, afd_results, afd_backend, npu_topology,
          lambda runs: results.metrics_json(completed_requests=1, failed_requests=0))
    assert n != 2, "split output differs"


@pytest.mark.stage_a
def test_stage_like(record_case):
    record_case()
"""


def test_gates_show_outcomes_and_stages_their_figures_with_cv_in_percent(fake):
    fake.makepyfile(test_mixed=GATE_AND_STAGE)
    result = run_fast(fake, "--afd-routing", "forced")
    result.assert_outcomes(passed=4, failed=1)
    text = result.stdout.str()
    assert "prefill_tokens_per_s -" not in text  # no row of an absent figure
    result.stdout.fnmatch_lines([
        "test (cases without a headline figure)*kind*cases*outcomes",
        "test_mixed.py::test_gate_like*gate*4*1 failed, 3 passed: ?2?",
        "",
        "case*kind*outcome*headline (median)*CV*labels",
        "test_mixed.py::test_stage_like*stage_a*passed*prefill_tokens_per_s 128 tokens/s*%*",
    ], consecutive=True)


def _entry(case_id, median, cv=None, kind="gate"):
    return {"case_id": case_id, "nodeid": case_id, "case_kind": kind, "metric": "m",
            "median": median, "cv": cv, "unit": "tokens/s", "synthetic": False,
            "comparability": "comparable"}


def test_outcome_rows_count_per_test_and_name_at_most_five_odd_cases():
    entries = [_entry(f"t.py::test_g[{n}]", None) for n in range(9)]
    outcomes = {entry["nodeid"]: ("failed" if n < 7 else "passed")
                for n, entry in enumerate(entries)}
    ((test, kind, cases, text),) = outcome_rows(entries, outcomes)
    assert (test, kind, cases) == ("t.py::test_g", "gate", "9")
    assert text == "7 failed, 2 passed: [0], [1], [2], [3], [4] and 2 more"


def test_cv_is_a_percentage_and_unknown_cv_a_dash():
    assert format_cv(0.7648) == "76.5%"
    assert format_cv(None) == "-"
    (row,) = measured_rows([_entry("t.py::test_s", 1234.5, 0.05, "stage_a")],
                           {"t.py::test_s": "passed"})
    assert row[3:5] == ("m 1234 tokens/s", "5.0%")


REQUIRE_HARDWARE_ENV = ("AFD_ASCEND_SERVER_URL", "AFD_ASCEND_SERVER_SETTINGS", "AFD_BACKEND",
                        "AFD_REQUIRE_HARDWARE", "AFD_REFERENCE_PHASE")


def _last_line(result: pytest.RunResult) -> str:
    return [line for line in result.outlines if line.strip()][-1]


def test_a_session_failed_for_want_of_hardware_ends_with_the_reason(pytester, monkeypatch):
    for name in REQUIRE_HARDWARE_ENV:
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile("def test_pure():\n    assert True\n")
    result = pytester.runpytest("--afd-backend", "vllm-ascend", "--afd-require-hardware",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1)
    last = _last_line(result)
    assert "session failed" in last
    assert "--afd-require-hardware: 0 cases measured on hardware (backend vllm-ascend)" in last


def test_a_passing_session_ends_with_pytests_own_line(pytester, monkeypatch):
    for name in REQUIRE_HARDWARE_ENV:
        monkeypatch.delenv(name, raising=False)
    pytester.makepyfile("def test_pure():\n    assert True\n")
    result = pytester.runpytest("--afd-backend", "vllm-ascend", "-p", "no:cacheprovider")
    assert result.ret == 0
    assert "1 passed" in _last_line(result)
