"""The seeded-fault check: command shape, bad input, and (slow) every fault caught by the gates."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_afd.__main__ import main
from pytest_afd.faults import check as fault_check
from pytest_afd.faults.registry import FAULTS

GATES_DIR = Path(__file__).resolve().parents[2] / "suites" / "gates"


def test_gate_command_runs_the_leak_seeing_modules_first(tmp_path):
    command = fault_check.gate_command(GATES_DIR, tmp_path)
    assert command[command.index("-m", 2) + 1] == "gate" and "-x" in command
    modules = [Path(arg).name for arg in command if arg.endswith(".py")]
    assert modules[: len(fault_check.FIRST_MODULES)] == list(fault_check.FIRST_MODULES)
    assert sorted(modules) == sorted(p.name for p in GATES_DIR.glob("test_*.py"))


def test_caught_by_names_the_failing_gate_test():
    line = "FAILED suites/gates/test_gate_1_glue_checks.py::test_x[a] - AssertionError: boom"
    run = fault_check.FaultRun("f", 1, True, 1.0, line, "")
    assert run.caught_by == "suites/gates/test_gate_1_glue_checks.py::test_x[a]"
    assert fault_check.FaultRun("f", 0, False, 1.0, None, "").caught_by is None


def test_unknown_fault_and_missing_gates_dir_are_errors(tmp_path, capsys):
    assert main(["fault-check", "--gates-dir", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown split-path fault 'nope'"):
        fault_check.fault_check(["nope"], gates_dir=GATES_DIR)


@pytest.mark.slow
def test_every_seeded_fault_makes_the_gates_fail():
    """The mutation check itself: `pytest -m gate` fails under each of the >= 8 fault classes."""
    runs = fault_check.fault_check(gates_dir=GATES_DIR)
    assert len(runs) == len(FAULTS) >= 8
    missed = {run.fault: (run.returncode, run.output_tail[-600:]) for run in runs if not run.caught}
    assert not missed, missed
