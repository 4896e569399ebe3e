"""The gates' split-path count under pytest-xdist (issue 40, finding 2): the workers tag each
split-path case's reports, so the controller, which collects nothing, still counts them."""

import json
from pathlib import Path

from tests.support.forked_pytest import runpytest_forked
from tests.support.plugin_pytester import FAST, run_fast

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[2]

GATES = """
import pytest

@pytest.mark.gate
@pytest.mark.parametrize("n", range(3))
def test_split_path(afd_backend, n):
    if n == 2:
        pytest.skip("needs the CPU backend's engine glue; this is a stand-in")

@pytest.mark.gate
def test_pure_check():
    pass
"""
LINE = ("gate: 2 of 3 split-path cases ran (in-process backend); the others need needs the "
        "CPU backend's engine glue (1)")


def test_the_count_in_one_process(fake):
    fake.makepyfile(test_gates=GATES)
    result = run_fast(fake)
    result.assert_outcomes(passed=3, skipped=1)
    assert LINE in result.stdout.lines, result.stdout.str()
    found = json.loads((fake.path / "afd-results" / "summary.json").read_text())["gate_runs"]
    assert (found["split_path_cases"], found["split_path_ran"]) == (3, 2)


def test_the_count_reaches_the_xdist_controller(fork_server, fake, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # this checkout's plugin, not an installed one
    fake.makepyfile(test_gates=GATES)
    result = runpytest_forked(fork_server, fake, *FAST, "-n", "2", "-p", "xdist")
    result.assert_outcomes(passed=3, skipped=1)
    assert LINE in result.stdout.lines, result.stdout.str()


def _report(nodeid, outcome, when="call", longrepr=None):
    import pytest

    from pytest_afd.run.gate_runs import SPLIT_PATH_PROPERTY

    return pytest.TestReport(nodeid, ("x.py", 0, nodeid), {"gate": 1}, outcome, longrepr, when,
                             user_properties=[(SPLIT_PATH_PROPERTY, True)])


def test_the_record_phase_says_it_recorded_references_and_never_fails():
    from pytest_afd.run.gate_runs import GateRunLedger

    ledger = GateRunLedger(require_hardware=True, exempt_phase=True, measured=lambda: ["a"],
                           hardware_backend=True)
    ledger.pytest_runtest_logreport(_report("a", "passed"))
    ledger.pytest_runtest_logreport(_report("b", "skipped", longrepr=("x.py", 1, "Skipped: why")))
    assert ledger.line().startswith("gate (record phase: references only): 1 of 2 split-path "
                                    "cases recorded their reference against the deployment")
    assert ledger.line().endswith("the others need why (1)")
