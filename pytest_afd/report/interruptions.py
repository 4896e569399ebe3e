"""The report says which of its sessions were interrupted, as the terminal and summary.json do.

An interrupted session's own summary copy (``shared_results.session_summary_path``)
carries ``interrupted`` (:mod:`pytest_afd.run.interrupted`); the report reads it for
each session it shows, so a Ctrl-C reads "interrupted: 12 of 17 cases not run",
not as failed or unfinished tests. A session whose summary copy is missing or
unreadable says nothing here (its results still carry their outcome reasons).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pytest_afd.results.shared import INTERRUPTED_SUMMARY_KEY as SUMMARY_KEY
from pytest_afd.results.shared import session_summary_path


def interrupted_lines(results_dir: Path, sessions: Iterable[str | None]) -> list[str]:
    """One line per shown session that was interrupted (then a blank line), else none."""
    lines = []
    for session in sorted({s for s in sessions if s}):
        try:
            summary = json.loads(session_summary_path(results_dir, session).read_text())
        except (OSError, ValueError):
            continue
        block = summary.get(SUMMARY_KEY) if isinstance(summary, dict) else None
        if isinstance(block, dict) and block.get("line"):
            lines.append(f"**Session {session}: {block['line']}.** Its cases not run have no "
                         "result; the one running was stamped with the interruption.")
    return [*lines, ""] if lines else []
