"""The one deprecation line the old entry points print (kept for one release, docs/cli.md).

It lives on the ground floor because the old module entry points
(``python -m pytest_afd.serving.server``, ``python -m pytest_afd.serving.cpu_deploy``) sit in
rooms below the command line that replaces them, and must not import it upward.
"""

from __future__ import annotations

import sys

REMOVED_AFTER = "0.1"


def warn(old: str, new: str) -> None:
    """One line on stderr (never stdout: scripts parse the tools' output)."""
    print(f"note: '{old}' is deprecated and goes after release {REMOVED_AFTER}; "
          f"use '{new}'", file=sys.stderr, flush=True)
