"""``pytest-afd``: one command for every tool of the harness, one subcommand per tool.

Modelled on vLLM's ``vllm serve|bench|...``: the top level knows only each
subcommand's name, one-line summary and where it lives, so ``pytest-afd --help``
starts in well under a second and never imports torch; a subcommand's module is
imported only when that subcommand runs. Every subcommand is a function
``run(argv, prog) -> int`` whose parser calls itself ``prog`` (``pytest-afd serve``),
so its ``--help`` and its errors name the command the user typed.

The old entry points stay for one release as aliases (``pytest_afd.cli.aliases``):
they print one deprecation line on stderr and run the same code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass

PROG = "pytest-afd"
USAGE_ERROR = 2


@dataclass(frozen=True)
class Command:
    """One subcommand: its summary for ``pytest-afd --help`` and its ``module:function``."""

    summary: str
    target: str

    def load(self):
        """The ``run(argv, prog) -> int`` function; imports its module only now."""
        module, function = self.target.split(":")
        return getattr(importlib.import_module(module), function)


COMMANDS: dict[str, Command] = {
    "report": Command("render a results directory into report.md, report.html and plots",
                      "pytest_afd.cli.tools:report"),
    "compare": Command("A/B: every shared case of two result selections, called beyond noise",
                       "pytest_afd.cli.tools:compare"),
    "profile-summary": Command("analyse profile directories taken by hand (ascend_pt or torch "
                               "traces)", "pytest_afd.cli.tools:profile_summary"),
    "fault-check": Command("check that `pytest -m gate` fails under every seeded fault",
                           "pytest_afd.cli.tools:fault_check"),
    "trace-imbalance": Command("request-boundary split imbalance of the shipped Azure traces",
                               "pytest_afd.cli.tools:trace_imbalance"),
    "launch-plan": Command("print the per-node vLLM-Ascend launch plan for an NPU topology",
                           "pytest_afd.cli.wrapped:launch_plan"),
    "chunk-plan": Command("what a prefill chunk size does to batch shapes",
                          "pytest_afd.cli.wrapped:chunk_plan"),
    "split": Command("plan a token-balanced split and print per-ubatch metadata",
                     "pytest_afd.cli.wrapped:split"),
    "serve": Command("serve a backend (the CPU model by default) over an OpenAI-style HTTP API",
                     "pytest_afd.cli.wrapped:serve"),
    "deploy-cpu": Command("the CPU deploy command (AFD_ASCEND_DEPLOY_COMMAND): up / down",
                          "pytest_afd.cli.wrapped:deploy_cpu"),
    "study": Command("the performance study: freeze, run, publish (pytest_afd.study)",
                     "pytest_afd.cli.wrapped:study"),
    "bench": Command("list, run and record the benchmarks in benchmarks/; render "
                     "docs/benchmarks.md", "pytest_afd.cli.bench:run"),
}

# Old entry point -> the command that replaces it (kept one release; docs/cli.md).
ALIASES: dict[str, str] = {
    "afd-split": "pytest-afd split",
    "afd-chunk-plan": "pytest-afd chunk-plan",
    "afd-launch-plan": "pytest-afd launch-plan",
    "python -m pytest_afd COMMAND": "pytest-afd COMMAND",
    "python -m pytest_afd.serving.server": "pytest-afd serve",
    "python -m pytest_afd.serving.cpu_deploy": "pytest-afd deploy-cpu",
}


def top_parser() -> argparse.ArgumentParser:
    """The top level: subcommand names and summaries only (no subcommand module imported)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="The pytest-afd tools: reports, A/B comparison, plans, the CPU server, "
        "the study and the benchmarks. The tests themselves run with pytest "
        "(python3 -m pytest -m gate). Run 'pytest-afd COMMAND --help' for a command's options.",
        epilog="Old names, kept for one release (each prints a deprecation line): "
        + "; ".join(f"{old} -> {new}" for old, new in ALIASES.items()) + ".",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                     help="one of the commands below")
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pytest-afd`` console script (and ``python -m pytest_afd.cli``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        top_parser().parse_args(argv[:1])  # prints help, or names the unknown command; exits
        return USAGE_ERROR  # pragma: no cover (parse_args exits on every such input)
    name = argv[0]
    return COMMANDS[name].load()(argv[1:], f"{PROG} {name}")
