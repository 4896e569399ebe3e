"""Every ``pytest-afd`` subcommand's ``--help`` names the command, helps on every option, and
reads as plain text; the checker itself fails on a parser that breaks any of those."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from pytest_afd.cli import COMMANDS, PROG, main, top_parser
from tests.support.cli_help import capture_parser, help_problems


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_subcommand_help_names_it_and_helps_every_option(name):
    prog = f"{PROG} {name}"
    parser = capture_parser(COMMANDS[name].load(), prog)
    assert parser is not None, f"{prog} returned without building a parser"
    assert help_problems(parser, prog) == []


def test_the_top_level_lists_every_subcommand_with_a_summary():
    assert help_problems(top_parser(), PROG) == []
    text = top_parser().format_help()
    for name in COMMANDS:
        assert f"    {name}" in text


def test_help_exits_0_and_prints_the_commands_own_usage(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["split", "plan", "--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: pytest-afd split plan")


def test_an_unknown_subcommand_is_named_with_the_choices(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["reprot"])
    assert exited.value.code == 2
    assert "invalid choice: 'reprot'" in capsys.readouterr().err


def test_top_level_help_imports_no_subcommand_module():
    code = ("import sys\nfrom pytest_afd.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'numpy', 'pytest_afd.serving.server', "
            "'pytest_afd.report') if m in sys.modules]\nprint('loaded:', heavy)")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                               timeout=120, check=True)
    assert "loaded: []" in completed.stdout


# --- the checker fails on what it must catch (seeded faults) -----------------------------
def _good_parser(prog: str = "pytest-afd demo") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="A demo command.")
    parser.add_argument("--size", type=int, help="how many")
    nested = parser.add_subparsers(dest="action", help="the action")
    nested.add_parser("go", help="go on").add_argument("--fast", action="store_true",
                                                        help="faster")
    return parser


def test_the_checker_passes_a_good_parser():
    assert help_problems(_good_parser(), "pytest-afd demo") == []


def test_the_checker_fails_an_option_without_help():
    parser = _good_parser()
    parser.add_argument("--seed", type=int)
    assert help_problems(parser, "pytest-afd demo") == ["pytest-afd demo: --seed has no help text"]


def test_the_checker_fails_a_nested_option_without_help():
    parser = _good_parser()
    nested = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    nested.add_parser("stop", help="stop it").add_argument("url")
    assert help_problems(parser, "pytest-afd demo") == ["pytest-afd demo stop: url has no help text"]


def test_the_checker_fails_a_nested_command_without_summary():
    parser = _good_parser()
    nested = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    nested.add_parser("quiet")
    assert "pytest-afd demo: subcommand quiet has no summary" in help_problems(
        parser, "pytest-afd demo")


def test_the_checker_fails_sphinx_markup_and_a_foreign_name():
    parser = argparse.ArgumentParser(prog="server.py",
                                     description="Serve any :class:`Backend` over ``HTTP``.")
    problems = help_problems(parser, "pytest-afd serve")
    assert problems[0] == "pytest-afd serve: the parser calls itself 'server.py'"
    assert problems[1].startswith("pytest-afd serve: Sphinx markup in --help")


def test_capture_returns_none_for_a_command_that_parses_nothing():
    assert capture_parser(lambda argv, prog: 0, "pytest-afd x") is None
