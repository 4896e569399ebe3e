"""split_bench's timing protocol: warm-calibrated samples in rounds of shuffled passes.

A round runs every callable ``passes`` times and keeps each one's fastest
pass (interference on a shared host only adds time); samples are sized from
warm calls. Thread CPU time throughout.
"""

from __future__ import annotations

import gc
import random
import time

import numpy as np

SAMPLE_TARGET_US = 1000.0
"""Calls per sample are sized so that one sample of warm calls takes about this long."""
CALIBRATION_WARMUPS = 20
CALIBRATION_BATCHES = 5
CALIBRATION_MIN_BATCH_NS = 50_000
"""Calibration batches grow tenfold until one lasts this long (clock reads then cost <1%)."""
CALIBRATION_MAX_CALLS = 10_000
PASSES = 3
"""Passes per round (a round keeps each callable's fastest: interference only adds time)."""


def calls_for(fn) -> int:
    """Calls per sample so one sample lasts about SAMPLE_TARGET_US of warm calls.

    Sized from the fastest of a few warm batches of calls, as pytest-benchmark
    calibrates its rounds: sizing from one cold first call (imports, cache
    misses) gave the fastest callables a dozen calls per sample, so each
    sample mostly timed the cache refill after the previous callable.
    """
    batch = 1
    for _ in range(CALIBRATION_WARMUPS):
        fn()
    while True:
        fastest_ns = min(_batch_ns(fn, batch) for _ in range(CALIBRATION_BATCHES))
        if fastest_ns >= CALIBRATION_MIN_BATCH_NS or batch >= CALIBRATION_MAX_CALLS:
            break
        batch *= 10
    once_us = max(fastest_ns / batch / 1000, 0.05)
    return max(1, int(SAMPLE_TARGET_US / once_us))


def _batch_ns(fn, calls: int) -> int:
    start = time.thread_time_ns()
    for _ in range(calls):
        fn()
    return time.thread_time_ns() - start


def time_interleaved(callables: dict, samples: int, seed: int, passes: int) -> dict:
    """Per-call microseconds per round and callable.

    A round runs every callable's sample ``passes`` times, in a shuffled order
    each pass, and keeps each callable's fastest: another tenant's burst on
    this shared host only ever adds time (the ``timeit`` convention, applied
    per round so that rounds still pair up adjacent in time). Also returns
    every sample (``all``) for the dispersion without that filter.
    """
    calls = {name: calls_for(fn) for name, fn in callables.items()}
    per_round = {name: [] for name in callables}
    every = {name: [] for name in callables}
    names = list(callables)
    order_rng = random.Random(seed)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(samples):
            fastest = dict.fromkeys(names, float("inf"))
            for _ in range(passes):
                order_rng.shuffle(names)
                for name in names:
                    fn, count = callables[name], calls[name]
                    start = time.thread_time_ns()
                    for _ in range(count):
                        fn()
                    per_call = (time.thread_time_ns() - start) / count / 1000
                    every[name].append(per_call)
                    fastest[name] = min(fastest[name], per_call)
            for name in names:
                per_round[name].append(fastest[name])
    finally:
        if gc_was_enabled:
            gc.enable()
    arrays = {name: np.array(values) for name, values in per_round.items()}
    return arrays, calls, {name: np.array(values) for name, values in every.items()}


def summary(values: np.ndarray, calls: int, every: np.ndarray) -> dict:
    """Median and p10 / p90 over rounds (of each round's fastest pass), and over every sample."""
    p10, median, p90 = np.percentile(values, (10, 50, 90))
    all_p10, all_median, all_p90 = np.percentile(every, (10, 50, 90))
    return {
        "median_us": round(float(median), 2),
        "p10_us": round(float(p10), 2),
        "p90_us": round(float(p90), 2),
        "rounds": int(values.size),
        "calls_per_sample": calls,
        "all_samples": {
            "median_us": round(float(all_median), 2),
            "p10_us": round(float(all_p10), 2),
            "p90_us": round(float(all_p90), 2),
            "samples": int(every.size),
        },
    }


def ratio(baseline: np.ndarray, candidate: np.ndarray) -> dict:
    """baseline / candidate: median of per-round ratios (with p10 / p90) and of medians."""
    paired = baseline / candidate
    p10, median, p90 = np.percentile(paired, (10, 50, 90))
    return {
        "median_paired": round(float(median), 3),
        "p10_paired": round(float(p10), 3),
        "p90_paired": round(float(p90), 3),
        "of_medians": round(float(np.median(baseline) / np.median(candidate)), 3),
    }
