"""engine_path_bench's timing protocol: interleaved rounds of shuffled passes, wall and
thread CPU time, each round keeping each path's fastest pass."""

from __future__ import annotations

import gc
import random
import time

import numpy as np

PERCENTILES = (10, 50, 90)
PASSES = 3
"""Passes per round (a round keeps each path's fastest: interference only adds time)."""


def time_interleaved(callables: dict, samples: int, calls: int, seed: int,
                     passes: int = PASSES) -> tuple[dict, dict]:
    """Per-call wall and thread-CPU microseconds per round; GC off.

    A round runs every callable's sample ``passes`` times, in a shuffled order
    each pass, and keeps each callable's fastest (wall and CPU apart): another
    tenant's burst only adds time (``timeit``'s convention, per round so rounds
    still pair up adjacent in time; split_bench and afd_overlap_bench do the
    same). Thread CPU time leaves out the time other processes hold the core.
    """
    wall = {name: [] for name in callables}
    cpu = {name: [] for name in callables}
    order = list(callables)
    shuffle = random.Random(seed).shuffle
    for function in callables.values():  # warm caches, lazy imports and the allocator
        function()
    gc.collect()
    gc.disable()
    try:
        for _ in range(samples):
            round_wall = dict.fromkeys(order, float("inf"))
            round_cpu = dict.fromkeys(order, float("inf"))
            for _ in range(passes):
                shuffle(order)
                for name in order:
                    function = callables[name]
                    start_cpu = time.thread_time_ns()
                    start = time.perf_counter_ns()
                    for _ in range(calls):
                        function()
                    elapsed = (time.perf_counter_ns() - start) / calls / 1e3
                    elapsed_cpu = (time.thread_time_ns() - start_cpu) / calls / 1e3
                    round_wall[name] = min(round_wall[name], elapsed)
                    round_cpu[name] = min(round_cpu[name], elapsed_cpu)
            for name in order:
                wall[name].append(round_wall[name])
                cpu[name].append(round_cpu[name])
    finally:
        gc.enable()
    return ({name: np.asarray(values) for name, values in wall.items()},
            {name: np.asarray(values) for name, values in cpu.items()})


def spread(values: np.ndarray) -> dict:
    p10, median, p90 = np.percentile(values, PERCENTILES)
    return {"p10": float(p10), "median": float(median), "p90": float(p90)}
