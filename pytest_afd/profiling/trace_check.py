"""Why a CPU run's torch.profiler traces cannot be analysed, said per case (issue 45).

One generic sentence ("no analysable traces") hid a whole session's loss. Before
the analysis reads a run's traces, :func:`missing_traces` looks at what the ranks
left under the run's trace root (``<root>/<role>/rank<i>/step<n>.pt.trace.json``,
``pytest_afd.backends.cpu.afd.tracing``) and names the first thing wrong:

- the root itself gone (removed before or while it was analysed);
- no trace file at all (no rank's profiler exported one);
- a rank that wrote no trace, or lacks a step the other ranks traced;
- an empty (truncated) trace file;
- before all of these, a rank's own report that it could not write its trace
  (:func:`write_failures`: the directory unwritable, the export failing).

A trace that is there but cannot be parsed, or an analysis that raises, is named
by :func:`analysis_failure` with the exception's type and text. Only a listing
and file sizes are read here: the analysis parses each file once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

_STEP_FILE = re.compile(r"^step(\d+)\.pt\.trace\.json$")
MAX_NAMED = 4
"""At most this many ranks or steps are named in one reason (then a count)."""


def _named(items: list[str]) -> str:
    shown = ", ".join(items[:MAX_NAMED])
    return shown if len(items) <= MAX_NAMED else f"{shown} and {len(items) - MAX_NAMED} more"


def rank_steps(root: Path, role: str, index: int) -> dict[int, Path]:
    """Step number -> trace file of one rank (empty when it wrote none)."""
    rank_dir = Path(root) / role / f"rank{index}"
    if not rank_dir.is_dir():
        return {}
    return {int(m.group(1)): path for path in rank_dir.iterdir()
            if (m := _STEP_FILE.match(path.name)) is not None}


def missing_traces(root: Path, ranks: Mapping[str, int]) -> str | None:
    """The reason the run's traces under ``root`` are incomplete (None: every rank wrote
    a non-empty trace of every step any rank traced). ``ranks``: role -> rank count."""
    root = Path(root)
    if not root.is_dir():
        return (f"the trace directory {root} was gone when the analysis began (removed "
                "before or while the run's traces were analysed)")
    found = {(role, index): rank_steps(root, role, index)
             for role, count in ranks.items() for index in range(count)}
    if not any(found.values()):
        return (f"no trace files were written under {root}: no rank's profiler exported a "
                "trace of the instrumented steps")
    silent = [f"{role} rank {index}" for (role, index), steps in found.items() if not steps]
    if silent:
        return f"{_named(silent)} wrote no trace under {root} (the other ranks did)"
    every_step = set().union(*(steps.keys() for steps in found.values()))
    short = [f"{role} rank {index} (step {_named([str(s) for s in sorted(every_step - steps.keys())])})"
             for (role, index), steps in found.items() if every_step - steps.keys()]
    if short:
        return f"a rank's trace file is missing: {_named(short)} under {root}"
    empty = [str(path.relative_to(root)) for steps in found.values() for path in steps.values()
             if path.stat().st_size == 0]
    if empty:
        return f"truncated trace file(s) of 0 bytes: {_named(sorted(empty))} under {root}"
    return None


def write_failures(errors: list[str]) -> str | None:
    """The ranks' own reports of traces they could not write (None: none failed)."""
    if not errors:
        return None
    unique = list(dict.fromkeys(errors))
    return f"trace writing failed on {len(unique)} rank-step(s): {_named(unique)}"


def analysis_failure(error: BaseException) -> str:
    """The absent reason of an analysis that raised: the exception's type and text."""
    return f"the trace analysis raised {type(error).__name__}: {error}"
