"""The CPU backend's instrumented AFD-process runs: torch.profiler traces -> ``evidence.profile``.

The runtime writes one trace per rank and instrumented step
(``pytest_afd.backends.cpu.afd.tracing``) under a directory made for the run;
after it, :func:`finish` analyses them with :mod:`pytest_afd.profiling.torch_trace`
(the same evidence code as NPU profiles) and removes them unless
``AFD_PROFILE_KEEP_TRACES`` names a directory to keep them in.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pytest_afd.core.backend import RunOutputs, RunSettings

ENV_KEEP_TRACES = "AFD_PROFILE_KEEP_TRACES"
TRACE_ROOT_PREFIX = "afd-traces-"


@dataclass
class TraceRun:
    runtime: object
    root: Path
    keep: bool


def start(runtime, settings: RunSettings) -> TraceRun | None:
    """Point ``runtime``'s instrumented steps at a fresh trace directory (None: not instrumented)."""
    if not settings.instrument:
        return None
    keep_root = os.environ.get(ENV_KEEP_TRACES)
    if keep_root:
        Path(keep_root).mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=TRACE_ROOT_PREFIX, dir=keep_root or None))
    runtime.trace_dir = str(root)
    return TraceRun(runtime, root, bool(keep_root))


def finish(run: TraceRun | None, outputs: RunOutputs) -> RunOutputs:
    """``outputs`` with its profile (absent with the reason when the traces cannot be analysed)."""
    if run is None:
        return outputs
    run.runtime.trace_dir = None
    try:
        from pytest_afd.profiling import torch_trace
        from pytest_afd.results.parts import per_rank_load

        num_ffn = run.runtime.topology.num_ffn
        load = per_rank_load(outputs.expert_load, num_ffn) if outputs.expert_load else None
        outputs.profile = torch_trace.analyse(run.root, expert_load_per_rank=load)
    except (ImportError, ValueError, RuntimeError) as error:
        outputs.profile = None
        outputs.timings = {**outputs.timings, "profile_problem": str(error)}
    finally:
        if not run.keep:
            shutil.rmtree(run.root, ignore_errors=True)
    return outputs
