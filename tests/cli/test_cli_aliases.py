"""The old entry points still work for one release, each saying once on stderr what replaces it;
the new command's module form stays silent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_afd.cli import ALIASES, aliases

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; CI runs 3.11
ROOT = Path(__file__).resolve().parents[2]


def _scripts() -> dict[str, str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_pyproject_installs_pytest_afd_and_the_old_scripts_as_aliases():
    assert _scripts() == {
        "pytest-afd": "pytest_afd.cli:main",
        "afd-split": "pytest_afd.cli.aliases:afd_split",
        "afd-chunk-plan": "pytest_afd.cli.aliases:afd_chunk_plan",
        "afd-launch-plan": "pytest_afd.cli.aliases:afd_launch_plan",
    }


@pytest.mark.parametrize(("script", "argv", "expected", "new"), [
    ("afd_chunk_plan", ["--prompt-len", "100", "--chunk", "8192"], "valid: 1 forwards",
     "pytest-afd chunk-plan"),
    ("afd_split", ["plan", "--tokens", "10,20"], "policy=token_balanced", "pytest-afd split"),
])
def test_an_old_console_script_runs_the_same_code_after_one_note(
        monkeypatch, capsys, script, argv, expected, new):
    monkeypatch.setattr(sys, "argv", [script, *argv])
    assert getattr(aliases, script)() == 0
    out, err = capsys.readouterr()
    assert expected in out
    assert err.count("\n") == 1 and f"use '{new}'" in err


def test_the_old_launch_plan_script_keeps_its_name_in_errors(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["afd-launch-plan", "--npu-topology", "dp0x", "--model", "m"])
    with pytest.raises(SystemExit):
        aliases.afd_launch_plan()
    err = capsys.readouterr().err
    assert "use 'pytest-afd launch-plan'" in err and "afd-launch-plan: error:" in err


def _module_help(*module: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *module, "--help"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize(("module", "new"), [
    (("pytest_afd", "report"), "pytest-afd report"),
    (("pytest_afd.serving.server",), "pytest-afd serve"),
    (("pytest_afd.serving.cpu_deploy",), "pytest-afd deploy-cpu"),
])
def test_an_old_module_form_notes_the_new_command_on_stderr_only(module, new):
    completed = _module_help(*module)
    assert completed.returncode == 0
    assert completed.stderr.strip().splitlines() == [
        completed.stderr.strip()] and f"use '{new}'" in completed.stderr
    assert completed.stdout.startswith("usage: ")


def test_the_new_module_form_is_silent_and_names_itself():
    completed = _module_help("pytest_afd.cli", "deploy-cpu")
    assert completed.returncode == 0 and completed.stderr == ""
    assert completed.stdout.startswith("usage: pytest-afd deploy-cpu")


def test_the_cli_page_lists_every_alias_and_its_replacement():
    page = (ROOT / "docs" / "cli.md").read_text()
    for old, new in ALIASES.items():
        assert f"`{old}`" in page and f"`{new}`" in page, old
