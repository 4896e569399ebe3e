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
from pytest_afd.profiling import trace_check
from pytest_afd.profiling.evidence import ATTENTION_ROLE, FFN_ROLE

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
    runtime.trace_errors = []
    return TraceRun(runtime, root, bool(keep_root))


def finish(run: TraceRun | None, outputs: RunOutputs) -> RunOutputs:
    """``outputs`` with its profile, or with the specific reason it has none
    (:mod:`pytest_afd.profiling.trace_check`): the traces are checked before they are
    analysed, and removed only after (unless kept)."""
    if run is None:
        return outputs
    run.runtime.trace_dir = None
    try:
        topology = run.runtime.topology
        problem = trace_check.write_failures(run.runtime.trace_errors) or \
            trace_check.missing_traces(
                run.root, {ATTENTION_ROLE: topology.num_attention, FFN_ROLE: topology.num_ffn})
        if problem is None:
            outputs.profile = _analyse(run.root, outputs, topology.num_ffn)
        else:
            outputs.profile, outputs.profile_absent_reason = None, problem
    except Exception as error:  # any failure: this case's named absent reason
        outputs.profile, outputs.profile_absent_reason = None, trace_check.analysis_failure(error)
    finally:
        if not run.keep:
            shutil.rmtree(run.root, ignore_errors=True)
    if outputs.profile_absent_reason is not None:
        outputs.timings = {**outputs.timings, "profile_problem": outputs.profile_absent_reason}
        if run.keep:
            outputs.profile_absent_reason += f" (traces kept in {run.root})"
    return outputs


def _analyse(root: Path, outputs: RunOutputs, num_ffn: int) -> dict:
    from pytest_afd.profiling import torch_trace
    from pytest_afd.results.parts import per_rank_load

    load = per_rank_load(outputs.expert_load, num_ffn) if outputs.expert_load else None
    return torch_trace.analyse(root, expert_load_per_rank=load)
