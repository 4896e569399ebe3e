"""Scheduling model and the ``afd-chunk-plan`` planner (see docs/chunk-planner.md)."""

from pytest_afd.scheduling.model import (
    ForwardBatch,
    ScheduledChunk,
    SchedulePlan,
    SchedulerConfig,
    comm_rounds,
    config_reasons,
    forward_rows_per_rank,
    schedule,
    zigzag_rows_per_rank,
)
from pytest_afd.scheduling.prefix_cache import (
    PrefixCacheIndex,
    block_keys,
    max_cacheable_tokens,
    realized_cached_tokens,
)


def main(argv: list[str] | None = None) -> int:
    """Console entry ``afd-chunk-plan``; the CLI module loads only when run."""
    from pytest_afd.scheduling.cli import main as cli_main

    return cli_main(argv)


__all__ = [
    "ForwardBatch",
    "PrefixCacheIndex",
    "SchedulePlan",
    "ScheduledChunk",
    "SchedulerConfig",
    "block_keys",
    "comm_rounds",
    "config_reasons",
    "forward_rows_per_rank",
    "main",
    "max_cacheable_tokens",
    "realized_cached_tokens",
    "schedule",
    "zigzag_rows_per_rank",
]
