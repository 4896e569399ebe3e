"""Per-step cost of the whole engine path vs the AFD plugin's own request-boundary path.

    python3 benchmarks/engine_path_bench.py [--quick] [--json] [--output out.json]
    PYTHONPATH=$PWD /work/venvs/vllm-0.19.1/bin/python benchmarks/engine_path_bench.py

Per layout (the real vLLM class where vLLM imports, else its 0.19.1 stand-in;
the vLLM-Ascend v0.19.1rc1 and v0.26.0rc stand-ins) and batch size (1, 8, 32,
128, 512 requests of Azure conv trace prompt lengths, scaled to at most
140,000 tokens, with prefix-cache hits) it times, interleaved in one process
(rounds of ``--passes`` shuffled passes, default 3; a round keeps each path's
fastest pass, as split_bench and afd_overlap_bench do: another tenant's burst
on this shared host only adds time):

* ``engine_path``: what the AFD-plugin hook runs per prefill step, through the
  hook's own functions (``stages.plan_stages`` then ``PlannedUBatchSlices.split``):
  token_balanced plan + the adapter's (compiled) split of the layout's common
  metadata object + the adapter's request-level check of what it produced,
  every fail-closed rule on.
* ``engine_plan_only``: the hook's planning alone (plan, step counter, no evidence
  file), so the adapter's share is engine_path minus this.
* ``plugin_style_path``: a plain-Python re-implementation of the AFD plugin's
  step (afd-plugin main 2e4378f): ``create_request_boundary_ubatch_slices``'s
  search (numpy prefix sums, Python ``min`` over the boundaries) plus
  ``_make_metadata_with_slice``'s per-field slicing of the same object. At one
  request the plugin does not split (its search returns None), so its path is
  a no-op there while the engine path splits the request.
* the breakdown (``engine_path_parts``), timed in the same interleaved rounds:
  ``adapter_split`` (the hook's splitter with the plan made), ``request_check``
  (the adapter's check alone) and ``torch_ops_floor`` (only the torch calls the
  adapter makes, replayed bare: the floor of any Python rewrite).

Targets (issue 24): engine_path <= 1.0x plugin_style_path at every layout and
size, on the median of per-round paired ratios in thread CPU time
(``time.thread_time_ns``: steadier on a loaded host; wall time is reported
beside it). Context: the per-step host cost as a fraction of the cost model's
(``afd_split.plan.cost``) modelled prefill step of the same batch, 140K tokens at 512
requests. A run above load 2 is repeated (``bench_load``); the JSON says
``load_ok``. JSON: one ``met`` flag per target, p10/median/p90 over rounds per
path; one summary line on stdout.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_load import DEFAULT_REPEATS, MAX_LOAD, load_note, run_until_quiet
from engine_path_metadata import build_layout_batch, layout_kinds_here, plugin_style_slice
from engine_path_parts import aten_ops, part_callables
from engine_path_timing import PASSES, spread, time_interleaved

from afd_split.hook.planning.engine_step import StepRanks
from afd_split.hook.planning.stages import (
    HookSession,
    ascend_splitter,
    plan_stages,
)
from afd_split.plan.cost import DEFAULT_COST_MODEL, modelled_plan_cost

BATCH_SIZES = (1, 8, 32, 128, 512)
MAX_RATIO_TO_PLUGIN = 1.0
"""Issue 24: the engine path costs no more than the plugin-style path (thread CPU, paired)."""
QUICK = {"samples": 7, "calls": 10, "passes": 2}
"""``--quick``: enough rounds to see the ratios (a loaded host; not a clean run)."""
MAX_BATCH_TOKENS = 140_000
PREFIX_HIT_FRACTION = 0.5
BLOCK_SIZE = 128
NUM_UBATCHES = 2
TRACE = (Path(__file__).resolve().parents[1]
         / "pytest_afd/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")


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
    modelled = modelled_plan_cost(DEFAULT_COST_MODEL, lengths, computed, plan.split_token)
    step_us = modelled["makespan_s"] * 1e6
    engine_cpu = spread(cpu["engine_path"])
    return {
        "layout": layout_kind,
        "num_requests": num_requests,
        "num_tokens": int(lengths.sum()),
        "num_prefix_hit_requests": int((computed > 0).sum()),
        "plugin_splits": plugin_style_request_boundary(lengths) is not None,
        "engine_path_us": spread(timed["engine_path"]),
        "engine_plan_only_us": spread(timed["engine_plan_only"]),
        "plugin_style_path_us": spread(timed["plugin_style_path"]),
        "ratio_engine_to_plugin": spread(timed["engine_path"] / timed["plugin_style_path"]),
        "engine_path_thread_cpu_us": engine_cpu,
        "engine_plan_only_thread_cpu_us": spread(cpu["engine_plan_only"]),
        "plugin_style_path_thread_cpu_us": spread(cpu["plugin_style_path"]),
        "ratio_engine_to_plugin_thread_cpu": spread(cpu["engine_path"] / cpu["plugin_style_path"]),
        "breakdown_thread_cpu_us": {name: spread(cpu[name])["median"]
                                    for name in ("engine_plan_only", *parts)},
        # The floor replays exactly the adapter's device ops: the same aten ops, counted.
        "adapter_aten_ops": aten_ops(parts["adapter_split"]),
        "floor_matches_adapter_ops": (aten_ops(parts["adapter_split"])
                                      == aten_ops(parts["torch_ops_floor"])),
        "modelled_step_us": step_us,
        "host_fraction_of_modelled_step": engine_cpu["median"] / step_us,
    }


def targets(rows: list[dict]) -> list[dict]:
    """One target per layout and size: engine_path <= 1.0x plugin_style_path (thread CPU)."""
    return [{
        "name": f"engine_path_vs_plugin_{row['layout']}_{row['num_requests']}_requests",
        "layout": row["layout"],
        "num_requests": row["num_requests"],
        "max_ratio": MAX_RATIO_TO_PLUGIN,
        "measured_ratio_thread_cpu": row["ratio_engine_to_plugin_thread_cpu"]["median"],
        "measured_ratio_wall": row["ratio_engine_to_plugin"]["median"],
        "engine_path_thread_cpu_us": row["engine_path_thread_cpu_us"]["median"],
        "plugin_style_path_thread_cpu_us": row["plugin_style_path_thread_cpu_us"]["median"],
        "met": row["ratio_engine_to_plugin_thread_cpu"]["median"] <= MAX_RATIO_TO_PLUGIN,
        **({} if row["plugin_splits"] else {
            "note": "the plugin does not split this batch (one request): its path is a no-op, "
                    "the engine path splits it"}),
    } for row in rows]


def cost_context(rows: list[dict]) -> dict:
    """Host cost per step as a fraction of the modelled prefill step (context, no target)."""
    return {
        "cost_model": DEFAULT_COST_MODEL.source,
        "num_moe_layers": DEFAULT_COST_MODEL.num_moe_layers,
        "per_layout_and_size": [{
            "layout": row["layout"], "num_requests": row["num_requests"],
            "num_tokens": row["num_tokens"], "modelled_step_us": round(row["modelled_step_us"], 1),
            "engine_path_thread_cpu_us": round(row["engine_path_thread_cpu_us"]["median"], 1),
            "host_fraction": row["host_fraction_of_modelled_step"],
        } for row in rows],
    }


def run_once(args, layout_kinds: list[str]) -> dict:
    # One batch per size, the same for every layout (its own generator per size).
    rows = [bench_size(size, kind, args.samples, args.calls,
                       np.random.default_rng([args.seed, size]), args.seed, args.passes)
            for kind in layout_kinds for size in args.sizes]
    return {
        "benchmark": "engine_path_bench",
        "metadata_layouts": layout_kinds,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "samples": args.samples,
        "calls_per_sample": args.calls,
        "passes": args.passes,
        "quick": args.quick,
        "protocol": f"{args.samples} rounds x {args.passes} shuffled passes of {args.calls} calls; "
        "a round keeps each path's fastest pass; medians and paired ratios over rounds",
        "block_size": BLOCK_SIZE,
        "sizes": rows,
        "targets": targets(rows),
        "context_host_cost_vs_modelled_step": cost_context(rows),
    }


def one_line(report: dict) -> str:
    entries = report["targets"]
    met = sum(entry["met"] for entry in entries)
    ratios = ", ".join(
        f"{entry['layout'].removesuffix('-standin')}@{entry['num_requests']}="
        f"x{entry['measured_ratio_thread_cpu']:.2f}{'' if entry['met'] else '!'}"
        for entry in entries)
    return (f"engine_path_bench: {met}/{len(entries)} targets met (engine/plugin-style, thread "
            f"CPU; ! = not met) [{load_note(report)}]: {ratios}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=41)
    parser.add_argument("--calls", type=int, default=20, help="calls per timed sample")
    parser.add_argument("--passes", type=int, default=PASSES,
                        help="passes per round; a round keeps each path's fastest")
    parser.add_argument("--quick", action="store_true",
                        help=f"few rounds ({QUICK}) to see the ratios; no repeat on load")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--layouts", nargs="+", help=f"default: {layout_kinds_here()}")
    parser.add_argument("--max-load", type=float, default=MAX_LOAD,
                        help="1-minute load average above which the run is repeated / flagged")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS,
                        help="extra attempts while the load is above --max-load")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument("--output", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
        args.repeats = 0
    for name in ("samples", "calls", "passes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} must be >= 1")
    if args.repeats < 0:
        parser.error(f"--repeats={args.repeats} must be >= 0")
    layout_kinds = args.layouts or layout_kinds_here()
    report = run_until_quiet(lambda: run_once(args, layout_kinds), max_load=args.max_load,
                             repeats=args.repeats)
    text = json.dumps(report, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    if args.json:
        print(text)
    # With --json stdout stays pure JSON; the summary line goes to stderr.
    print(one_line(report), file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
