"""Profiler ranges the split path emits around each stage and layer.

A profile is attributed to layers and stages from these ranges, never from the
order kernels ran in. One grammar, written here and parsed by the analysis
(``pytest_afd.profiling``), so the emitter and the reader cannot drift:

    afd|<stage>|L<layer>|U<ubatch>        e.g. ``afd|attention|L5|U0``

``L-`` / ``U-`` mean "no layer" (embedding, final norm) / "whole batch" (dense
layers run unstaged). The range goes to ``torch.profiler.record_function``,
which both ``torch.profiler`` (CPU, Chrome trace ``user_annotation`` events)
and ``torch_npu.profiler`` (``trace_view.json``) keep. Stage names are the AFD
runtime's span kinds (docs/profiling.md).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

RANGE_PREFIX = "afd"
NO_INDEX = -1
_SEPARATOR = "|"
_PATTERN = re.compile(r"^afd\|([a-z_]+)\|L(-|\d+)\|U(-|\d+)$")


@dataclass(frozen=True)
class RangeTag:
    """The stage, layer and ubatch a range names (-1: none / whole batch)."""

    stage: str
    layer: int = NO_INDEX
    ubatch: int = NO_INDEX


def _index(value: int) -> str:
    return "-" if value < 0 else str(value)


def range_name(stage: str, layer: int = NO_INDEX, ubatch: int = NO_INDEX) -> str:
    """The range name for ``stage`` of ``layer`` / ``ubatch``; rejects names that cannot parse."""
    if not re.fullmatch(r"[a-z_]+", stage):
        raise ValueError(f"range stage {stage!r}: expected lower-case letters and '_'")
    return _SEPARATOR.join((RANGE_PREFIX, stage, f"L{_index(layer)}", f"U{_index(ubatch)}"))


def parse_range(name: str) -> RangeTag | None:
    """The tag of an AFD range name; None for any other event name."""
    match = _PATTERN.match(name)
    if match is None:
        return None
    stage, layer, ubatch = match.groups()
    return RangeTag(stage, NO_INDEX if layer == "-" else int(layer),
                    NO_INDEX if ubatch == "-" else int(ubatch))


@contextlib.contextmanager
def emit_range(stage: str, layer: int = NO_INDEX, ubatch: int = NO_INDEX,
               enabled: bool = True) -> Iterator[None]:
    """A ``record_function`` range around the block (a no-op when disabled or torch is absent).

    ``record_function`` costs a few microseconds when no profiler is active, so
    callers pass ``enabled=False`` on headline runs.
    """
    if not enabled:
        yield
        return
    try:
        from torch.profiler import record_function
    except ImportError:  # framework-neutral base: no torch, no range
        yield
        return
    with record_function(range_name(stage, layer, ubatch)):
        yield
