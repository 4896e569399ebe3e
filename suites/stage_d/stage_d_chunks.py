"""Stage D: chunk-size candidates at the stage scale, the planner's view, the best sizes.

The planner (``pytest_afd.scheduling``) decides validity before anything runs;
its configuration mirrors the run settings a stage hands the backend, so its
plan is what the backend should schedule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_afd.core.backend import RunSettings
from pytest_afd.scheduling import SchedulerConfig
from pytest_afd.scheduling.sweep import SweepCandidate, sweep

# The RFC's initial sweep, in logical (full-scale) tokens; None = unchunked reference.
LOGICAL_CHUNK_SIZES = (8192, 16384, 32768, 65536)
UNCHUNKED = None
# Suites schedule per DP replica: ``chunk_size`` is the per-replica budget.
# A stack that folds a global flag by its DP size freezes that in its own plan.
CHUNK_DP_FOLDING = 1
# Per-round dispatch/combine capacity of the recipe's stack (chunk-semantics §4), logical.
LOGICAL_ROUND_CAPACITY = 8192
BEST_COUNT = 2


def chunk_label(chunk_size: int | None) -> str:
    return "unchunked" if chunk_size is None else f"chunk{chunk_size}"


def scaled_candidates(scale_tokens) -> list[int | None]:
    """The RFC's sizes at the stage scale (``scale_tokens``: logical -> scaled), then unchunked."""
    return [scale_tokens(size) for size in LOGICAL_CHUNK_SIZES] + [UNCHUNKED]


def planner_config(settings: RunSettings, round_capacity: int) -> SchedulerConfig:
    """The scheduler configuration the run settings stand for."""
    if settings.pcp_size is None:
        raise ValueError(
            "planner_config needs an explicit RunSettings.pcp_size (None means the "
            "topology's layout: resolve it, e.g. with StageRunner.settings, first)"
        )
    return SchedulerConfig(
        chunk_size=settings.chunk_size,
        dp_size=CHUNK_DP_FOLDING,
        cp_size=settings.pcp_size,
        page_size=settings.block_size,
        max_batched_tokens=settings.max_num_batched_tokens,
        max_running_seqs=settings.max_num_seqs,
        round_capacity=round_capacity,
    )


def plan_sweep(
    prompt_lengths: Sequence[int],
    candidates: Sequence[int | None],
    settings: RunSettings,
    round_capacity: int,
    cached_tokens: Sequence[int] | None = None,
) -> list[SweepCandidate]:
    return sweep(
        prompt_lengths,
        candidates,
        base_config=planner_config(settings, round_capacity),
        cached_tokens=cached_tokens,
    )


def best_sizes(throughput: Mapping[int | None, float], count: int = BEST_COUNT) -> list[int]:
    """The ``count`` chunk sizes (unchunked excluded) with the highest median throughput."""
    chunked = [size for size in throughput if size is not UNCHUNKED]
    return sorted(chunked, key=lambda size: (-throughput[size], size))[:count]
