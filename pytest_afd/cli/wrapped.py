"""Subcommands whose parser lives with the code it drives; each module is imported only here.

Each function is ``run(argv, prog) -> int``: the module's own ``main`` with the
parser named ``prog`` (``pytest-afd split``), so ``--help`` and error lines name the
command the user typed.
"""

from __future__ import annotations

from collections.abc import Sequence


def launch_plan(argv: Sequence[str], prog: str) -> int:
    from pytest_afd.backends.vllm_ascend.launch import main

    return main(argv, prog=prog)


def chunk_plan(argv: Sequence[str], prog: str) -> int:
    from pytest_afd.scheduling.cli import main

    return main(argv, prog=prog)


def split(argv: Sequence[str], prog: str) -> int:
    from afd_split.cli import main

    return main(list(argv), prog=prog)


def serve(argv: Sequence[str], prog: str) -> int:
    from pytest_afd.serving.server import main

    return main(list(argv), prog=prog)


def deploy_cpu(argv: Sequence[str], prog: str) -> int:
    from pytest_afd.serving.cpu_deploy import main

    return main(argv, prog=prog)


def study(argv: Sequence[str], prog: str) -> int:
    """The rest of argv goes to ``pytest_afd.study.cli.main(argv, prog=...)`` unchanged."""
    from pytest_afd.study.cli import main

    return main(list(argv), prog=prog)
