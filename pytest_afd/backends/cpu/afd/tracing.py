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


def trace_path(trace_dir: str | Path, role: str, role_index: int, step: int) -> Path:
    return Path(trace_dir) / role / f"rank{role_index}" / f"step{step}{TRACE_SUFFIX}"


@contextlib.contextmanager
def traced(spec, body: MutableMapping[str, Any]) -> Iterator[None]:
    """Profile the command when its body names a trace directory (removed from ``body``)."""
    trace_dir = body.pop(TRACE_DIR_KEY, None)
    if not trace_dir:
        yield
        return
    from torch.autograd.profiler import profile

    path = trace_path(trace_dir, spec.role, spec.role_index, int(body["step"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    # record_shapes as the AFD plugin's NPU profiler: message sizes come from the shapes.
    # The Kineto profiler torch.profiler.profile drives, called directly: the same Chrome
    # trace, without torch.profiler's first-start probe of torch._inductor, which imports
    # it (1.5 s per rank process here, more under load).
    with profile(use_cpu=True, use_kineto=True, record_shapes=True) as profiler:
        yield
    profiler.export_chrome_trace(str(path))
