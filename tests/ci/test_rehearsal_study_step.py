"""The nightly rehearsal's study step (.ci/rehearse-nightly ``run_study``): it runs the whole
study through the CPU deploy command (the slow test) with its files under the workspace,
and reports a problem unless that test ran and passed (a skip or an empty run is not green)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.ascend_deployments import REPO, rehearsal_module


@pytest.fixture
def module():
    return rehearsal_module()


def _step(module, monkeypatch, code: int, text: str) -> tuple[list[str], list[str]]:
    commands: list[str] = []

    def fake_step(name, command, env, log_dir):
        commands.append(command)
        assert env["PYTHONPATH"] == str(REPO)
        return code, text

    monkeypatch.setattr(module, "run_step", fake_step)
    return module.run_study(Path("/w")), commands


def test_study_step_runs_the_deploy_command_study_test_into_the_workspace(module, monkeypatch):
    problems, (command,) = _step(module, monkeypatch, 0, "==== 1 passed in 812.3s ====")
    assert problems == []
    assert f"-m slow {module.STUDY_TEST} --basetemp /w/{module.STUDY_DIR}" in command
    assert (REPO / module.STUDY_TEST).is_file()


@pytest.mark.parametrize(("code", "text", "problem"), [
    (1, "==== 1 failed in 3.0s ====", "exit 1"),
    (0, "==== 1 skipped in 0.1s ====", "did not run and pass"),
    (0, "==== 1 deselected in 0.1s ====", "did not run and pass"),
])
def test_study_step_is_a_problem_unless_the_test_passed(module, monkeypatch, code, text, problem):
    problems, _ = _step(module, monkeypatch, code, text)
    assert len(problems) == 1 and problem in problems[0]
