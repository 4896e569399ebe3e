"""Walk every ``pytest-afd`` subcommand's argparse parser and list what its ``--help`` lacks.

A subcommand is a ``run(argv, prog)`` function that builds its parser and parses
at once; :func:`capture_parser` stops it at that moment (``parse_known_args``
raises with the parser in hand), so each parser is checked exactly as the command
builds it, without running anything. :func:`help_problems` then reads the
parser and, through argparse's subparsers, every nested command.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from unittest import mock

# reStructuredText / Sphinx markup that a terminal shows raw: ``code``, :role:`x`.
SPHINX_MARKUP = re.compile(r"``|:[a-z]+:`")


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def capture_parser(run: Callable[[list[str], str], int], prog: str) -> argparse.ArgumentParser | None:
    """The first parser ``run`` parses with, or None when it returned without parsing."""

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture):
        try:
            run([], prog)
        except _Captured as captured:
            return captured.parser
    return None


def _subcommands(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:
    return [action for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)]


def help_problems(parser: argparse.ArgumentParser, prog: str) -> list[str]:
    """Every fault of ``parser``'s help and its nested commands' (empty: all good).

    Faults: the usage line does not name ``prog``; an option or positional without
    help text; a nested command without a summary; Sphinx markup anywhere in the help.
    """
    problems = []
    if parser.prog != prog or f"usage: {prog}" not in parser.format_usage():
        problems.append(f"{prog}: the parser calls itself {parser.prog!r}")
    text = parser.format_help()
    if SPHINX_MARKUP.search(text):
        problems.append(f"{prog}: Sphinx markup in --help: {SPHINX_MARKUP.search(text)[0]!r}")
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.metavar or action.dest
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            problems.append(f"{prog}: {name} has no help text")
    for group in _subcommands(parser):
        # argparse lists a nested command in --help only when it was given help=.
        summaries = {choice.dest: choice.help for choice in group._choices_actions}
        for name in group.choices:
            if not (summaries.get(name) or "").strip():
                problems.append(f"{prog}: subcommand {name} has no summary")
        for name, child in group.choices.items():
            problems += help_problems(child, f"{prog} {name}")
    return problems
