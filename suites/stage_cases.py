"""Stage cases and their measurements: what one case runs, what its runs measured."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stage_backends import BackendHandle

from pytest_afd.core.backend import (
    CAP_CHUNKED_PREFILL,
    CAP_FORCED_ROUTING,
    CAP_PREFIX_CACHE,
    CAP_SPLIT,
    CAP_W8A8,
    Backend,
    RunOutputs,
    RunSettings,
)
from pytest_afd.results import documents as afd_result_docs
from pytest_afd.results.documents import is_absent
from pytest_afd.workloads import Workload

# --- cache phases ------------------------------------------------------------------
PHASE_COLD = "cold"  # prefix cache dropped before every run
PHASE_STEADY = "steady"  # dropped, then the shared prefix seeded, before every run
PHASES = (PHASE_COLD, PHASE_STEADY)

THROUGHPUT_METRIC = "prefill_tokens_per_s"
NO_STEP_EVIDENCE = "the backend reported no per-step split evidence"
# Used only when the backend gave no specific reason (RunOutputs.profile_absent_reason).
NO_PROFILE_REASON = "the instrumented run left no analysable profiler traces (no reason given)"


@dataclass(frozen=True)
class StageCase:
    """One measured case: a workload, run settings and the cache phase it is measured in."""

    name: str  # unique within one measure() call; the result's case id suffix
    workload: Workload
    settings: RunSettings
    phase: str = PHASE_COLD
    labels: Mapping[str, Any] | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    notes: str | None = None
    # Where the case runs (None: the runner's backend); lets one schedule
    # interleave cases on different backends (Stage F: AFD vs PP layout).
    handle: BackendHandle | None = None

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"phase={self.phase!r}; expected one of {PHASES}")
        if self.phase == PHASE_STEADY and not self.settings.prefix_caching:
            raise ValueError(f"case {self.name!r}: the steady phase needs prefix_caching=True")


@dataclass
class MeasuredCase:
    """Measured repetitions of one case, its optional instrumented run and the written result."""

    case: StageCase
    runs: list[RunOutputs]
    instrumented: RunOutputs | None
    result: dict[str, Any]
    path: Path | None = None

    @property
    def throughput(self) -> float:
        """Median prefill tokens/s over the measured repetitions."""
        return float(self.result["metrics"][THROUGHPUT_METRIC]["stats"]["median"])

    @property
    def throughput_repetitions(self) -> list[float]:
        """Every measured repetition's prefill tokens/s (the dispersion a comparison must beat)."""
        return [float(v) for v in self.result["metrics"][THROUGHPUT_METRIC]["repetitions"]]

    @property
    def representative(self) -> RunOutputs:
        return self.runs[-1]

    @property
    def has_step_evidence(self) -> bool:
        return not is_absent(self.result["evidence"]["steps"])

    @property
    def has_expert_load(self) -> bool:
        return not is_absent(self.result["evidence"]["expert_load"])

    @property
    def max_imbalance(self) -> float | None:
        tokens = self.result["evidence"]["tokens"]
        return None if is_absent(tokens) else tokens["max_imbalance"]

    @property
    def realized_hit_ratio(self) -> float:
        return float(self.result["evidence"]["prefix_cache"]["realized_hit_ratio"])


def required_capabilities(settings: RunSettings) -> list[str]:
    """What a backend must declare to run ``settings`` as asked (no silent downgrade)."""
    needed = []
    if settings.split_policy != "none":
        needed.append(CAP_SPLIT)
    if settings.prefix_caching:
        needed.append(CAP_PREFIX_CACHE)
    if settings.chunk_size is not None:
        needed.append(CAP_CHUNKED_PREFILL)
    if settings.routing == "forced_balanced":
        needed.append(CAP_FORCED_ROUTING)
    if settings.quantization == "w8a8":
        needed.append(CAP_W8A8)
    return needed


def missing_capabilities(backend: Backend, settings: RunSettings) -> list[str]:
    return [cap for cap in required_capabilities(settings) if cap not in backend.capabilities]


def mean_step_time(run: RunOutputs) -> float:
    """Run wall time over forward steps: the step time without instrumenting anything."""
    if not run.steps:
        raise ValueError("the backend reported no forward steps for a run")
    return run.wall_time_s / len(run.steps)


def step_metrics(runs: Sequence[RunOutputs]) -> dict[str, Any]:
    """``step_time_s`` and ``forward_steps``, absent when the backend reports no steps."""
    if not all(run.steps for run in runs):
        reason = next((run.steps_absent_reason for run in runs
                       if not run.steps and run.steps_absent_reason), NO_STEP_EVIDENCE)
        missing = afd_result_docs.absent(reason)
        return {"step_time_s": missing, "forward_steps": missing}
    return {
        "step_time_s": afd_result_docs.measurement([mean_step_time(run) for run in runs], "s"),
        "forward_steps": len(runs[-1].steps),
    }
