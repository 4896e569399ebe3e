"""Host cost per split step as a fraction of the modelled NPU step (issues 33 and 43).

    python3 benchmarks/engine_path_bench.py [--quick] [--json] [--output out.json]
        [--cost-model coefficients.json] [--torch-threads N]
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
  token_balanced plan + the adapter's split of the layout's common
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

* ``builder_state_guard``: the hook's guard around the stage build (``preserved_state``
  over builder bindings and the prefix (``stage_write_bound``) of every buffer a stage
  build writes through, plus ``own_stage_views``), at the recipe's buffer sizes
  (``engine_path_guard``); ``builder_state_guard_whole_buffers``: the same copying whole
  buffers, as the guard did before issue 43.

* ``deployed_hook``: what the hook runs per step with its deployed split threshold
  (``--split-min-tokens``, default ``AFD_SPLIT_MIN_TOKENS``'s ``DEFAULT_SPLIT_MIN_TOKENS``,
  ``afd_split.hook.planning.threshold``): below it the step is counted and left unsplit;
  from it on ``engine_path`` and the guard.

Targets (issue 43, replacing issue 33's recipe-batch-only target): per layout and batch
size, from one request to the recipe's batch (the Attention role's ``--max-num-seqs 32``
requests of trace prompt lengths filling ``--max-num-batched-tokens 140000``), the
deployed hook's host cost per step (``deployed_hook``, thread CPU median) is at most 1%
of the modelled NPU step of that many tokens; beside it, never the target, the forced
split's (``forced_hook``: ``engine_path`` then the guard in one call; threshold 0, as the
gates run), ``forced_split_within_budget`` per size (``engine_path_targets``)
(``afd_split.plan.npu_step.RECIPE_NPU_STEP``: CloudMatrix-Infer's 6,688 prefill
tokens/s per 910C NPU on the recipe's 32 NPUs, 0.654 s at 140,000 tokens; a
proportional model with no fixed term, so small steps are modelled short and the
fraction is an upper bound). Beside each: the plugin's own request-boundary path
(``ratio_engine_to_plugin_thread_cpu``, and the host cost over it), the guard's cost
with whole buffers (before issue 43: ``builder_state_guard_whole_buffers``), and the
shortest step the host cost stays within 1% of (``break_even_step_ms``). Context, no
target: the fraction of the calibrated ``CostModel`` step (``modelled_plan_cost``;
``--cost-model`` takes a JSON of ``CostModel`` fields). Torch runs
one intra-op thread (``--torch-threads``) as the runner's host thread does between
device launches; a run above load 2 is repeated (``bench_load``); the JSON says
``load_ok``, the load before and after, and the process CPU time. JSON: one ``met``
flag per target, p10/median/p90 over rounds per path; one summary line on stdout.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_load import DEFAULT_REPEATS, MAX_LOAD, emit_report, load_note, run_until_quiet
from engine_path_guard import RECIPE_MAX_NUM_SEQS, guard_callable, step_bound
from engine_path_metadata import build_layout_batch, layout_kinds_here, plugin_style_slice
from engine_path_parts import aten_ops, part_callables
from engine_path_targets import (
    context,
    guarded_bytes_at,
    one_line,
    suggested_split_min_tokens,
    targets,
)
from engine_path_timing import PASSES, spread, time_interleaved

from afd_split.hook.planning.engine_step import StepRanks
from afd_split.hook.planning.stages import (
    HookSession,
    ascend_splitter,
    plan_stages,
)
from afd_split.hook.planning.threshold import DEFAULT_SPLIT_MIN_TOKENS
from afd_split.plan.cost import DEFAULT_COST_MODEL, CostModel, modelled_plan_cost
from afd_split.plan.npu_step import RECIPE_NPU_STEP, NpuStepModel

BATCH_SIZES = (1, 8, 16, 24, 32, 128, 512)
"""Requests per batch: 374, 3,913, 9,492, 16,391 (just past the default split threshold),
26,594, 112,971 and 139,747 tokens of the trace's prompts."""
RECIPE_BATCH = "recipe"
"""The ``batch`` label of the recipe's batch (32 requests filling 140,000 tokens)."""
TORCH_THREADS = 1
QUICK = {"samples": 7, "calls": 10, "passes": 2}
"""``--quick``: enough rounds to see the ratios (a loaded host; not a clean run)."""
MAX_BATCH_TOKENS = 140_000
PREFIX_HIT_FRACTION = 0.5
BLOCK_SIZE = 128
NUM_UBATCHES = 2
TRACE = (Path(__file__).resolve().parents[1]
         / "pytest_afd/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")


def prompt_lengths(num_requests: int, offset: int, fill: bool = False) -> np.ndarray:
    """Trace prompt lengths from row ``offset`` on, scaled to fit the batched-token budget
    (``fill``: scaled to fill it, the last request taking the rounding, as a full chunk)."""
    with TRACE.open() as handle:
        rows = itertools.islice(csv.DictReader(handle), offset, offset + num_requests)
        lengths = np.array([int(row["ContextTokens"]) for row in rows], dtype=np.int64)
    total = int(lengths.sum())
    if total > MAX_BATCH_TOKENS or fill:
        lengths = np.maximum(1, lengths * MAX_BATCH_TOKENS // total)
    if fill:
        lengths[-1] += MAX_BATCH_TOKENS - int(lengths.sum())
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


def bench_size(num_requests: int | str, layout_kind: str, samples: int, calls: int,
               rng: np.random.Generator, seed: int, passes: int = PASSES,
               cost_model: CostModel = DEFAULT_COST_MODEL, guard=None,
               npu_model: NpuStepModel = RECIPE_NPU_STEP,
               split_min_tokens: int = DEFAULT_SPLIT_MIN_TOKENS) -> dict:
    recipe = num_requests == RECIPE_BATCH
    count = RECIPE_MAX_NUM_SEQS if recipe else num_requests
    lengths = prompt_lengths(count, offset=seed * count, fill=recipe)
    computed = prefix_hits(lengths, rng)
    batch = build_layout_batch(layout_kind, lengths, computed, BLOCK_SIZE)
    splitter = batch.splitter or ascend_splitter(chunked_prefill=True)
    # Forced: every step split (threshold 0, as the gates run); deployed: the default
    # threshold, no evidence file (a production worker's session).
    session = HookSession(ranks=StepRanks(global_rank=0), groups=[], splitter=splitter)
    deployed = HookSession(ranks=StepRanks(global_rank=0), groups=[], splitter=splitter,
                           min_split_tokens=split_min_tokens)

    def engine_path():
        stages = plan_stages(session, lengths, num_computed_tokens=computed,
                             block_size=BLOCK_SIZE, slice_type=batch.slice_type)
        if stages is not None:
            stages.split(batch.common)

    def forced_hook():
        # The same with every step split (threshold 0): plan + split + check, and the guard.
        engine_path()
        guard_step(bound)

    def deployed_hook():
        # What the hook runs per step at the deployed threshold: below it, the count alone;
        # from it on, plan + split + check, and the guard around the stage build.
        stages = plan_stages(deployed, lengths, num_computed_tokens=computed,
                             block_size=BLOCK_SIZE, slice_type=batch.slice_type)
        if stages is not None:
            stages.split(batch.common)
            guard_step(bound)

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
    guard_step, guard_sizes = guard if guard is not None else guard_callable()
    bound = step_bound(lengths)
    deployed_split = plan_stages(deployed, lengths, num_computed_tokens=computed,
                                 block_size=BLOCK_SIZE, slice_type=batch.slice_type) is not None
    timed, cpu = time_interleaved({"engine_path": engine_path, "engine_plan_only": engine_plan_only,
                                   "deployed_hook": deployed_hook, "forced_hook": forced_hook,
                                   "plugin_style_path": plugin_style_path,
                                   "builder_state_guard": lambda: guard_step(bound),
                                   "builder_state_guard_whole_buffers": guard_step, **parts},
                                  samples, calls, seed, passes)
    modelled = modelled_plan_cost(cost_model, lengths, computed, plan.split_token)
    step_us = modelled["makespan_s"] * 1e6
    npu_step_us = npu_model.step_s(int(lengths.sum())) * 1e6
    engine_cpu = spread(cpu["engine_path"])
    forced_cpu = spread(cpu["forced_hook"])
    host_cpu = spread(cpu["deployed_hook"])
    added_cpu = spread(cpu["forced_hook"] - cpu["plugin_style_path"])  # paired per round
    return {
        "layout": layout_kind,
        "batch": RECIPE_BATCH if recipe else "sizes",
        "num_requests": count,
        "num_tokens": int(lengths.sum()),
        "num_prefix_hit_requests": int((computed > 0).sum()),
        "plugin_splits": plugin_style_request_boundary(lengths) is not None,
        "split_min_tokens": split_min_tokens,
        "deployed_split": deployed_split,
        "deployed_hook_us": spread(timed["deployed_hook"]),
        "ratio_deployed_to_plugin_thread_cpu":
            spread(cpu["deployed_hook"] / cpu["plugin_style_path"]),
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
        "builder_state_guard_thread_cpu_us": spread(cpu["builder_state_guard"]),
        "builder_state_guard_whole_buffers_thread_cpu_us":
            spread(cpu["builder_state_guard_whole_buffers"]),
        "guard_bound_entries": bound,
        "guarded_bytes_per_step": guarded_bytes_at(guard_sizes, bound),
        "host_cost_thread_cpu_us": host_cpu,
        "forced_host_cost_thread_cpu_us": forced_cpu,
        "forced_host_fraction_of_npu_step": forced_cpu["median"] / npu_step_us,
        "host_cost_over_plugin_path_thread_cpu_us": added_cpu,
        "modelled_step_us": step_us,
        "npu_step_us": npu_step_us,
        "host_fraction_of_npu_step": host_cpu["median"] / npu_step_us,
        "host_fraction_of_npu_step_p90": host_cpu["p90"] / npu_step_us,
        "host_fraction_of_modelled_step": forced_cpu["median"] / step_us,
        "host_fraction_p90": forced_cpu["p90"] / step_us,
        "engine_path_fraction_of_modelled_step": engine_cpu["median"] / step_us,
    }


def run_once(args, layout_kinds: list[str], cost_model: CostModel,
             npu_model: NpuStepModel = RECIPE_NPU_STEP) -> dict:
    # One batch per size, the same for every layout (its own generator per size).
    guard = guard_callable()
    sizes = [RECIPE_BATCH, *args.sizes]
    cpu_before = os.times()
    rows = [bench_size(size, kind, args.samples, args.calls,
                       np.random.default_rng([args.seed, RECIPE_MAX_NUM_SEQS if size == RECIPE_BATCH
                                              else size]),
                       args.seed, args.passes, cost_model, guard, npu_model,
                       args.split_min_tokens)
            for kind in layout_kinds for size in sizes]
    cpu_after = os.times()
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
        "torch_threads": torch.get_num_threads(),
        "process_cpu_s": {"user": round(cpu_after.user - cpu_before.user, 2),
                          "system": round(cpu_after.system - cpu_before.system, 2)},
        "builder_state_guard": guard[1],
        "split_min_tokens": args.split_min_tokens,
        "sizes": rows,
        "npu_step_model": npu_model.to_evidence(),
        "targets": targets(rows),
        "suggested_split_min_tokens_p90": suggested_split_min_tokens(rows, npu_model),
        "context_host_cost_vs_modelled_step": context(rows, cost_model),
    }


def load_cost_model(path: Path | None) -> CostModel:
    """``DEFAULT_COST_MODEL``, or a ``CostModel`` from a JSON object of its fields."""
    if path is None:
        return DEFAULT_COST_MODEL
    try:
        fields = json.loads(path.read_text())
        return CostModel(**{"source": str(path), **fields})
    except (OSError, ValueError, TypeError) as error:
        raise SystemExit(f"--cost-model={str(path)!r}: not a JSON object of CostModel "
                         f"fields ({error})") from None


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
    parser.add_argument("--cost-model", type=Path,
                        help="JSON of afd_split.plan.cost.CostModel fields (default: DEFAULT_COST_MODEL)")
    parser.add_argument("--torch-threads", type=int, default=TORCH_THREADS,
                        help="torch intra-op threads while timing")
    parser.add_argument("--split-min-tokens", type=int, default=DEFAULT_SPLIT_MIN_TOKENS,
                        help="the deployed hook's AFD_SPLIT_MIN_TOKENS (the forced split is "
                             "always timed beside it)")
    parser.add_argument("--json", action="store_true", help="print the JSON report")
    parser.add_argument("--output", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
        args.repeats = 0
    if args.split_min_tokens < 0:
        parser.error(f"--split-min-tokens={args.split_min_tokens} must be >= 0")
    for name in ("samples", "calls", "passes", "torch_threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.repeats < 0:
        parser.error(f"--repeats={args.repeats} must be >= 0")
    cost_model = load_cost_model(args.cost_model)
    torch.set_num_threads(args.torch_threads)
    layout_kinds = args.layouts or layout_kinds_here()
    report = run_until_quiet(lambda: run_once(args, layout_kinds, cost_model),
                             max_load=args.max_load,
                             repeats=args.repeats)
    emit_report(report, one_line(report, load_note(report)), output=args.output,
                as_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
