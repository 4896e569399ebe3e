"""No false green: a hardware-backend session that measured nothing says so, and can fail."""

import json
import os
from pathlib import Path

import pytest

from tests.support.inner_pytest import UNRELATED_PLUGINS

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]
ATTACH_VARIABLES = ("AFD_ASCEND_SERVER_URL", "AFD_ASCEND_SERVER_SETTINGS", "AFD_BACKEND",
                    "AFD_REQUIRE_HARDWARE", "AFD_REFERENCE_PHASE")
PURE_TESTS = """
def test_pure_python_check():
    assert 1 + 1 == 2

def test_needs_the_backend(afd_backend):
    pass
"""


@pytest.fixture
def no_deployment(monkeypatch):
    for name in ATTACH_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def summary_of(pytester):
    return json.loads((pytester.path / "afd-results" / "summary.json").read_text())


def test_zero_cases_on_hardware_is_said_and_summarized(pytester, no_deployment):
    pytester.makepyfile(PURE_TESTS)
    result = pytester.runpytest("--afd-backend", "vllm-ascend", "-p", "no:cacheprovider")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*0 cases measured on hardware (backend vllm-ascend)*"])
    hardware = summary_of(pytester)["hardware"]
    assert hardware["cases_measured_on_hardware"] == 0 and hardware["fails_session"] is False


def test_require_hardware_turns_zero_into_a_failed_session(pytester, no_deployment):
    pytester.makepyfile(PURE_TESTS.split("def test_needs")[0])
    result = pytester.runpytest("--afd-backend", "vllm-ascend", "--afd-require-hardware",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*0 cases measured on hardware*--afd-require-hardware: "
                                 "failing the session*"])
    assert summary_of(pytester)["hardware"]["fails_session"] is True


def test_emulated_backend_makes_no_hardware_claim(pytester, no_deployment):
    pytester.makepyfile(PURE_TESTS.split("def test_needs")[0])
    result = pytester.runpytest("--afd-backend", "cpu", "--afd-require-hardware",
                                "-p", "no:cacheprovider")
    assert result.ret == 0
    assert "measured on hardware" not in result.stdout.str()


def test_bad_reference_phase_names_its_source(pytester, monkeypatch):
    pytester.makepyfile(PURE_TESTS.split("def test_needs")[0])
    monkeypatch.setenv("AFD_REFERENCE_PHASE", "replay")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*$AFD_REFERENCE_PHASE='replay': expected one of live, record, check*"])


def test_gate_skip_reasons_name_what_differs(tmp_path, fork_server):
    """No "empty parameter set", and a mismatch names only the option that differs."""
    env = {key: value for key, value in os.environ.items() if key not in ATTACH_VARIABLES}
    env["PYTHONPATH"] = str(REPO)
    # A fresh pytest process forked from the session's fork server (torch imported once).
    completed = fork_server.run_module(
        "pytest",
        ["-p", "no:cacheprovider", *UNRELATED_PLUGINS, "-rs", "-q",
         "suites/gates/test_gate_1_token_split.py::test_gate_1_afd_runtime_split_matches_unsplit",
         "suites/gates/test_gate_4_full_natural.py", "--afd-backend", "vllm-ascend",
         "--npu-topology", "dp3pcp8-ep8", "--afd-results-dir", str(tmp_path)],
        cwd=REPO, env=env, timeout=600)
    output = completed.stdout
    assert "empty parameter set" not in output
    assert "process-pair runtime is the CPU backend's" in output
    assert "needs --afd-model full (this session: reduced)" in output
    assert "--npu-topology dp3pcp8-ep8 (this session" not in output


STAND_IN_CONFTEST = '''
from pytest_afd.core.backend import RunOutputs
from pytest_afd.serving.http_backend import HttpBackend


class StandInBackend(HttpBackend):
    """Counts as the harness's own CPU server standing in (it says device cpu)."""

    def __init__(self):
        super().__init__("vllm-ascend", frozenset(), launcher=None)

    def run(self, prompts, settings):
        self.completed_runs += 1
        return RunOutputs(requests=[])

    def stand_in_device(self):
        return "cpu"

    def reset_prefix_cache(self):
        pass

    def describe(self):
        return {}

    def close(self):
        pass


def pytest_afd_create_backend(config, name, topology, model_name, seed, results_dir):
    return StandInBackend()
'''


def test_worker_counts_reach_the_controller_under_xdist(pytester, no_deployment):
    """A stand-in backend run in each xdist worker is counted once, in the controller."""
    pytest.importorskip("xdist")
    pytester.makeconftest(STAND_IN_CONFTEST)
    pytester.makepyfile("""
import pytest

@pytest.mark.parametrize("case", range(4))
def test_runs_once(afd_backend, case):
    afd_backend.run([], None)
""")
    result = pytester.runpytest("--afd-backend", "vllm-ascend", "-n", "2", "-p", "no:cacheprovider",
                                *UNRELATED_PLUGINS)
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*0 cases measured on hardware*; 4 ran on a pytest-afd server*"])
    assert summary_of(pytester)["hardware"]["cases_on_stand_in"] == 4


PHASE_CASES = '''
import os
import pytest

@pytest.mark.parametrize("case", ["a", "b", "c", "d"])
def test_prefill(afd_backend, case):
    if case in os.environ.get("SKIP_CASES", ""):
        pytest.skip("the deployment could not run it")
    afd_backend.run([], None)
'''


def test_check_phase_that_measures_fewer_cases_fails_naming_them(pytester, no_deployment,
                                                                 monkeypatch):
    """The record phase writes what it measured; a check phase missing two of them fails once."""
    pytester.makeconftest(STAND_IN_CONFTEST)
    pytester.makepyfile(PHASE_CASES)
    common = ("--afd-backend", "vllm-ascend", "--afd-golden-dir", "refs", "-p", "no:cacheprovider")
    recorded = pytester.runpytest(*common, "--afd-reference-phase", "record")
    assert recorded.ret == 0
    assert json.loads((pytester.path / "refs" / "record-phase-cases.json").read_text())[
        "measured_cases"] == [f"test_check_phase_that_measures_fewer_cases_fails_naming_them.py::"
                              f"test_prefill[{case}]" for case in "abcd"]
    monkeypatch.setenv("SKIP_CASES", "bd")
    checked = pytester.runpytest(*common, "--afd-reference-phase", "check")
    checked.assert_outcomes(passed=2, skipped=2)
    assert checked.ret == pytest.ExitCode.TESTS_FAILED
    line = next(text for text in checked.stdout.lines if "fewer than the record phase" in text)
    assert "the check phase measured 2 case(s) fewer" in line
    assert "::test_prefill[b], " in line and line.endswith("::test_prefill[d]; failing the session")
    assert summary_of(pytester)["hardware"]["missing_from_record_phase"][0].endswith("[b]")


def test_emulated_cases_meet_require_hardware_only_when_allowed(pytester, no_deployment):
    """Stand-in cases are never hardware: --afd-require-hardware fails unless --afd-allow-emulated."""
    pytester.makeconftest(STAND_IN_CONFTEST)
    pytester.makepyfile(PHASE_CASES)
    common = ("--afd-backend", "vllm-ascend", "--afd-require-hardware", "-p", "no:cacheprovider")
    strict = pytester.runpytest(*common)
    strict.assert_outcomes(passed=4)
    assert strict.ret == pytest.ExitCode.TESTS_FAILED
    rehearsal = pytester.runpytest(*common, "--afd-allow-emulated")
    assert rehearsal.ret == 0
    hardware = summary_of(pytester)["hardware"]
    assert hardware["cases_measured_on_hardware"] == 0 and hardware["cases_on_stand_in"] == 4
    assert hardware["allow_emulated"] is True and hardware["fails_session"] is False
