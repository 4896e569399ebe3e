"""Which code a process runs: its interpreter and its pytest_afd, and a checkout's git commit.

An A/B run of two code versions (``--afd-ab-checkout``, docs/report.md
"Interleaved A/B") is only evidence if each side's results say which code
produced them. The harness's CPU server reports :func:`running_code` at
``/afd/describe`` (what it really imported), and the harness records
:func:`checkout_commit` of the directory it was given (what the user meant).
A fact that cannot be read is an absent record with its reason, never a guess.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from pytest_afd.core.absent import absent

GIT_TIMEOUT_S = 30
# This file is pytest_afd/core/code_identity.py: the package directory is two levels up.
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def running_code() -> dict[str, Any]:
    """This process's interpreter, its version and the pytest_afd package directory it imported."""
    return {"python": sys.executable, "python_version": platform.python_version(),
            "pytest_afd": str(PACKAGE_DIR)}


def _git(directory: Path, *args: str) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(["git", "-C", str(directory), *args], capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def checkout_commit(directory: str | Path) -> dict[str, Any]:
    """``{"git_commit": sha, "git_dirty": bool}`` of a git work tree, else both absent with why.

    ``git_dirty`` says whether uncommitted changes exist: the commit alone
    would then not name the code that ran.
    """
    directory = Path(directory)
    head = _git(directory, "rev-parse", "--verify", "HEAD")
    if head is None or head.returncode != 0:
        why = (f"{directory} is not a git work tree with a commit "
               f"({(head.stderr.strip() if head else 'git not runnable')[:200]})")
        return {"git_commit": absent(why), "git_dirty": absent(why)}
    status = _git(directory, "status", "--porcelain", "--untracked-files=no")
    dirty: Any = (bool(status.stdout.strip()) if status is not None and status.returncode == 0
                  else absent(f"`git status` failed in {directory}"))
    return {"git_commit": head.stdout.strip(), "git_dirty": dirty}
