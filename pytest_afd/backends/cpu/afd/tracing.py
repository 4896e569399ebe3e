"""Instrumented AFD steps write real ``torch.profiler`` traces, one per rank and step.

The rank's timeline spans also open ``afd_split.ranges`` ranges, so the Chrome
trace carries the same stages as the timeline, and ``pytest_afd.profiling``
analyses it exactly as it analyses an NPU profile (docs/profiling.md). Layout,
the one :mod:`pytest_afd.profiling.torch_trace` reads::

    <trace_dir>/<role>/rank<role index>/step<step>.pt.trace.json
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

TRACE_DIR_KEY = "trace_dir"
TRACE_SUFFIX = ".pt.trace.json"
TRACE_ERROR_KEY = "trace_error"  # in a rank's reply: its trace of the step was not written


def trace_path(trace_dir: str | Path, role: str, role_index: int, step: int) -> Path:
    return Path(trace_dir) / role / f"rank{role_index}" / f"step{step}{TRACE_SUFFIX}"


class TraceWrite:
    """What became of one rank's trace of one step: ``error`` names a failed write."""

    def __init__(self) -> None:
        self.error: str | None = None

    def annotate(self, reply: Any) -> Any:
        """The rank's reply, carrying the trace error for the parent (issue 45)."""
        if self.error is not None and isinstance(reply, dict):
            reply[TRACE_ERROR_KEY] = self.error
        return reply


@contextlib.contextmanager
def traced(spec, body: MutableMapping[str, Any]) -> Iterator[TraceWrite]:
    """Profile the command when its body names a trace directory (removed from ``body``).

    A trace that cannot be written (its directory unwritable, the export failing) does
    not fail the step: the step's outputs are good. The error, with the rank's name, is
    handed back in the reply (:meth:`TraceWrite.annotate`), so the run's profile is
    absent with that reason instead of missing without one."""
    written = TraceWrite()
    trace_dir = body.pop(TRACE_DIR_KEY, None)
    if not trace_dir:
        yield written
        return
    from torch.autograd.profiler import profile

    path = trace_path(trace_dir, spec.role, spec.role_index, int(body["step"]))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        written.error = f"{spec.role} rank {spec.role_index} could not write {path}: {error}"
        yield written
        return
    # record_shapes as the AFD plugin's NPU profiler: message sizes come from the shapes.
    # The Kineto profiler torch.profiler.profile drives, called directly: the same Chrome
    # trace, without torch.profiler's first-start probe of torch._inductor, which imports
    # it (1.5 s per rank process here, more under load).
    with profile(use_cpu=True, use_kineto=True, record_shapes=True) as profiler:
        yield written
    try:
        profiler.export_chrome_trace(str(path))
    except (OSError, RuntimeError) as error:
        written.error = f"{spec.role} rank {spec.role_index} could not write {path}: {error}"
