"""Per-step cost of the whole engine path vs the AFD plugin's own request-boundary path.

    python3 benchmarks/engine_path_bench.py [--json] [--output out.json]
    PYTHONPATH=$PWD /work/venvs/vllm-0.19.1/bin/python benchmarks/engine_path_bench.py

Per batch size (1, 8, 64, 512 requests of Azure conv trace prompt lengths,
scaled to at most 140,000 tokens, with prefix-cache hits) it times, interleaved
in one process (rounds of ``--passes`` shuffled passes, default 3; a round keeps
each path's fastest pass, as split_bench and afd_overlap_bench do: another
tenant's burst on this shared host only adds time):

* ``engine_path``: what the AFD-plugin hook runs per prefill step, through the
  hook's own functions (``stages.plan_stages`` then ``PlannedUBatchSlices.split``):
  token_balanced plan + the adapter's split of a real-layout common metadata
  object + the adapter's request-level check of what it produced. The object is
  vLLM's ``CommonAttentionMetadata`` when vLLM is importable (vLLM adapter),
  else a structural stand-in of vLLM-Ascend v0.19.1rc1's
  ``AscendCommonAttentionMetadata`` from the pinned field list (Ascend adapter).
* ``engine_plan_only``: the hook's planning alone (plan, step counter, no evidence
  file), so the adapter's share is engine_path minus this.
* ``plugin_style_path``: a plain-Python re-implementation of the AFD plugin's
  step (afd-plugin main 2e4378f): ``create_request_boundary_ubatch_slices``'s
  search (numpy prefix sums, Python ``min`` over the boundaries) plus
  ``_make_metadata_with_slice``'s per-field slicing of the same object.
* the breakdown (``engine_path_parts``), timed in the same interleaved rounds:
  ``adapter_split`` (the hook's splitter with the plan made), ``request_check``
  (the adapter's check alone) and ``torch_ops_floor`` (only the torch calls the
  adapter makes, replayed bare: the floor of any Python rewrite).

Targets (issue 17, "Whole engine path"): engine_path median <= 100 us at 8
requests and <= 300 us at 512; reported with the ratio to plugin_style_path, in wall
and thread CPU time (``time.thread_time_ns``: steadier on a loaded host).
JSON: one ``met`` flag per target, p10/median/p90 over rounds per path, the paired ratio's
p10/median/p90, ``os.getloadavg()`` before and after; one summary line on stdout.
"""

from __future__ import annotations

import argparse
import csv
import gc
import itertools
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_path_metadata import build_layout_batch, plugin_style_slice
from engine_path_parts import aten_ops, part_callables

from afd_split.integrations.afd_plugin.stages import (
    HookSession,
    ascend_splitter,
    plan_stages,
)
from afd_split.integrations.engine_step import StepRanks

BATCH_SIZES = (1, 8, 64, 512)
TARGETS_US = {8: 100.0, 512: 300.0}
MAX_BATCH_TOKENS = 140_000
PREFIX_HIT_FRACTION = 0.5
BLOCK_SIZE = 128
NUM_UBATCHES = 2
TRACE = (Path(__file__).resolve().parents[1]
         / "pytest_afd/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
PERCENTILES = (10, 50, 90)
PASSES = 3
"""Passes per round (a round keeps each path's fastest: interference only adds time)."""


def prompt_lengths(num_requests: int, offset: int) -> np.ndarray:
    """Trace prompt lengths from row ``offset`` on, scaled to fit the batched-token budget."""
    with TRACE.open() as handle:
        rows = itertools.islice(csv.DictReader(handle), offset, offset + num_requests)
        lengths = np.array([int(row["ContextTokens"]) for row in rows], dtype=np.int64)
    total = int(lengths.sum())
    if total > MAX_BATCH_TOKENS:
        lengths = np.maximum(1, lengths * MAX_BATCH_TOKENS // total)
    return lengths


def prefix_hits(lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Computed tokens per request: whole blocks of a cached prefix for about half of them."""
    hit = rng.random(lengths.size) < PREFIX_HIT_FRACTION
    return np.where(hit, rng.integers(1, 8, lengths.size) * BLOCK_SIZE, 0).astype(np.int64)


def plugin_style_request_boundary(num_scheduled_tokens: np.ndarray):
    """The plugin's search: the boundary with the closest stage token counts (ties: even
    request counts). None when fewer than two requests, as the plugin returns."""
    num_reqs = len(num_scheduled_tokens)
    if num_reqs < NUM_UBATCHES:
        return None
    cumulative = np.zeros(num_reqs + 1, dtype=np.int32)
    np.cumsum(num_scheduled_tokens, dtype=np.int32, out=cumulative[1:])
    total = int(cumulative[-1])

    def imbalance(boundary: int) -> tuple[int, int]:
        return (abs(int(cumulative[boundary]) * NUM_UBATCHES - total),
                abs(boundary * NUM_UBATCHES - num_reqs))

    boundary = min(range(1, num_reqs), key=imbalance)
    cut = int(cumulative[boundary])
    return [(slice(0, boundary), slice(0, cut)), (slice(boundary, num_reqs), slice(cut, total))]


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


def bench_size(num_requests: int, layout_kind: str, samples: int, calls: int,
               rng: np.random.Generator, seed: int, passes: int = PASSES) -> dict:
    lengths = prompt_lengths(num_requests, offset=seed * num_requests)
    computed = prefix_hits(lengths, rng)
    batch = build_layout_batch(layout_kind, lengths, computed, BLOCK_SIZE)
    session = HookSession(ranks=StepRanks(global_rank=0), groups=[],
                          splitter=batch.splitter or ascend_splitter(chunked_prefill=True))

    def engine_path():
        stages = plan_stages(session, lengths, num_computed_tokens=computed,
                             block_size=BLOCK_SIZE, slice_type=batch.slice_type)
        if stages is not None:
            stages.split(batch.common)

    def engine_plan_only():
        plan_stages(session, lengths, num_computed_tokens=computed, block_size=BLOCK_SIZE,
                    slice_type=batch.slice_type)

    def plugin_style_path():
        slices = plugin_style_request_boundary(lengths)
        if slices is not None:
            for request_slice, token_slice in slices:
                plugin_style_slice(batch, request_slice, token_slice)

    plan = plan_stages(session, lengths, num_computed_tokens=computed, block_size=BLOCK_SIZE,
                       slice_type=batch.slice_type).plan
    parts = part_callables(batch, plan, session.splitter, BLOCK_SIZE)
    timed, cpu = time_interleaved({"engine_path": engine_path, "engine_plan_only": engine_plan_only,
                                   "plugin_style_path": plugin_style_path, **parts},
                                  samples, calls, seed, passes)
    ratio = timed["engine_path"] / timed["plugin_style_path"]
    return {
        "num_requests": num_requests,
        "num_tokens": int(lengths.sum()),
        "num_prefix_hit_requests": int((computed > 0).sum()),
        "engine_path_us": spread(timed["engine_path"]),
        "engine_plan_only_us": spread(timed["engine_plan_only"]),
        "plugin_style_path_us": spread(timed["plugin_style_path"]),
        "ratio_engine_to_plugin": spread(ratio),
        "engine_path_thread_cpu_us": spread(cpu["engine_path"]),
        "engine_plan_only_thread_cpu_us": spread(cpu["engine_plan_only"]),
        "plugin_style_path_thread_cpu_us": spread(cpu["plugin_style_path"]),
        "ratio_engine_to_plugin_thread_cpu": spread(cpu["engine_path"] / cpu["plugin_style_path"]),
        "breakdown_thread_cpu_us": {name: spread(cpu[name])["median"]
                                    for name in ("engine_plan_only", *parts)},
        # The floor replays exactly the adapter's device ops: the same aten ops, counted.
        "adapter_aten_ops": aten_ops(parts["adapter_split"]),
        "floor_matches_adapter_ops": (aten_ops(parts["adapter_split"])
                                      == aten_ops(parts["torch_ops_floor"])),
    }


def targets(rows: dict) -> list[dict]:
    return [{
        "name": f"engine_path_{size}_requests",
        "target_us": limit,
        "measured_median_us": rows[size]["engine_path_us"]["median"],
        "measured_thread_cpu_median_us": rows[size]["engine_path_thread_cpu_us"]["median"],
        "ratio_to_plugin_style_median": rows[size]["ratio_engine_to_plugin"]["median"],
        "met": rows[size]["engine_path_us"]["median"] <= limit,
    } for size, limit in TARGETS_US.items() if size in rows]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=41)
    parser.add_argument("--calls", type=int, default=20, help="calls per timed sample")
    parser.add_argument("--passes", type=int, default=PASSES,
                        help="passes per round; a round keeps each path's fastest")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument("--output", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    for name in ("samples", "calls", "passes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} must be >= 1")
    from engine_path_metadata import layout_kind_here

    layout_kind = layout_kind_here()
    rng = np.random.default_rng(args.seed)
    load_before = os.getloadavg()
    rows = {size: bench_size(size, layout_kind, args.samples, args.calls, rng, args.seed,
                             args.passes) for size in args.sizes}
    report = {
        "benchmark": "engine_path_bench",
        "metadata_layout": layout_kind,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "samples": args.samples,
        "calls_per_sample": args.calls,
        "passes": args.passes,
        "protocol": f"{args.samples} rounds x {args.passes} shuffled passes of {args.calls} calls; "
        "a round keeps each path's fastest pass; medians and paired ratios over rounds",
        "block_size": BLOCK_SIZE,
        "sizes": list(rows.values()),
        "targets": targets(rows),
    }
    text = json.dumps(report, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    if args.json:
        print(text)
    parts = [f"{t['name']}: {t['measured_median_us']:.1f} us wall, "
             f"{t['measured_thread_cpu_median_us']:.1f} us thread CPU (<= {t['target_us']:.0f}: "
             f"{'met' if t['met'] else 'NOT met'}, x{t['ratio_to_plugin_style_median']:.2f} "
             "plugin-style)" for t in report["targets"]]
    # With --json stdout stays pure JSON; the summary line goes to stderr.
    print(f"engine_path_bench [{layout_kind}, load {load_before[0]:.1f}]: " + "; ".join(parts),
          file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
