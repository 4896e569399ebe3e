"""Where the AFD ranks run on this host: threads per rank and one core per rank.

Each rank is pinned to a core of the parent's allowed set, round robin, and gets an even
share of those cores as torch threads, so both roles really run at once.
"""

from __future__ import annotations

import os


def default_threads_per_rank(world_size: int) -> int:
    """Split the visible cores between the ranks so both roles really run at once."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // world_size)


def allowed_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def cpu_affinity(world_size: int) -> list[int]:
    """Core of each global rank: the allowed cores, round robin."""
    cores = allowed_cores()
    return [cores[rank % len(cores)] for rank in range(world_size)]
