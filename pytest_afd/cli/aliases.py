"""The old entry points, kept for one release: each prints one deprecation line on stderr
naming the command that replaces it, then runs exactly the same code.

``afd-split``, ``afd-chunk-plan`` and ``afd-launch-plan`` are console scripts pointing
here; ``python -m pytest_afd COMMAND``, ``python -m pytest_afd.serving.server`` and
``python -m pytest_afd.serving.cpu_deploy`` call :func:`warn` from their ``__main__``
blocks (importing those modules stays silent). The list is ``pytest_afd.cli.ALIASES``.
"""

from __future__ import annotations

import sys

REMOVED_AFTER = "0.1"


def warn(old: str, new: str) -> None:
    """One line on stderr (never stdout: scripts parse the tools' output)."""
    print(f"note: '{old}' is deprecated and goes after release {REMOVED_AFTER}; "
          f"use '{new}'", file=sys.stderr, flush=True)


def afd_split() -> int:
    from afd_split.cli import main

    warn("afd-split", "pytest-afd split")
    return main()


def afd_chunk_plan() -> int:
    from pytest_afd.scheduling.cli import main

    warn("afd-chunk-plan", "pytest-afd chunk-plan")
    return main()


def afd_launch_plan() -> int:
    from pytest_afd.backends.vllm_ascend.launch import main

    warn("afd-launch-plan", "pytest-afd launch-plan")
    return main()


def module_main(old: str) -> int:
    """``python -m pytest_afd COMMAND ...`` -> ``pytest-afd COMMAND ...``."""
    from pytest_afd.cli import main

    command = sys.argv[1] if len(sys.argv) > 1 else "COMMAND"
    warn(f"{old} {command}", f"pytest-afd {command}")
    return main(sys.argv[1:])
