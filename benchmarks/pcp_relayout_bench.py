"""Per-step cost of token_balanced under PCP on one Attention rank (a figure, not a timed test).

    python3 benchmarks/pcp_relayout_bench.py [--json] [--output out.json] [--rounds N]

What the hook adds per PCP step on the host (pcp 8, the recipe's Attention PCP):
``rank_relayout`` (the rank's index maps between the parent's whole-request zigzag
and each stage's own) and ``pcp_stage_metadata`` (each stage's vLLM-Ascend
v0.19.1rc1 metadata for its relaid rows), on batches the size of the recipe's
steps (``--max-num-batched-tokens 140000``): one 64K-token request, five requests
of 140K tokens with prefix hits, 32 x ~4K and 128 x ~1K requests, each cut inside
a request. Thread CPU time; each round runs every case 3 times, in shuffled
order, and keeps the fastest (another tenant's burst only adds time).

Also, per case, what the relayout moves between the PCP ranks, in bytes each rank
receives per step: the two all-gathers (into the stages after the dense layers,
back after the last MoE layer) of the hidden and residual rows of the exchanged
requests, at DeepSeek V3.2's hidden size in bf16. That volume is a property of
the layout (no target); its time on HCCS is not measured here.

Target: per case, relayout + stage metadata median <= 5 ms. JSON: p10/median/p90
per figure, ``met`` per target; above ``--max-load`` (default 2) the run is repeated
and the quietest attempt kept, with every attempt's load (``bench_load``); one
summary line on stdout (stderr with --json), saying whether the run was clean.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import time

import numpy as np
import torch
from bench_load import add_load_arguments, emit_report, load_note, run_until_quiet

from afd_split import BatchMetadata, SplitConstraints, plan_split
from afd_split.engine.ascend_pcp import pcp_stage_metadata
from afd_split.pcp.relayout import rank_relayout
from pytest_afd.backends.cpu.pcp import PcpEmulation

PCP = 8
ALIGN = 2 * PCP  # the engine's PCP alignment (afd_split.pcp.alignment)
RANK = 3
BLOCK_SIZE = 128
HIDDEN = 7168
BF16_BYTES = 2
TENSORS_MOVED = 2  # hidden states and residual
PASSES = 3
TARGET_MS = 5.0
CASES = {
    "one_64k": ([65536], [0]),
    "five_140k": ([8000, 30000, 12000, 70000, 20000], [0, 128, 0, 4096, 0]),
    "32_x_4k": ([4096 + 37 * i for i in range(32)], [0] * 32),
    "128_x_1k": ([1000 + 3 * i for i in range(128)], [256] * 128),
}


def prepared(counts, computed):
    plan = plan_split(counts, policy="token_balanced",
                      constraints=SplitConstraints(pcp_size=PCP, align=ALIGN),
                      num_computed_tokens=computed)
    if plan.boundary_request is None:
        raise AssertionError(f"{counts}: the cut is not inside a request")
    metadata = BatchMetadata.from_requests(counts, computed, block_size=BLOCK_SIZE)
    return plan, PcpEmulation(plan, metadata).engine_common(metadata, RANK)


def one_step(plan, common, computed) -> tuple[float, float]:
    """(relayout, stage metadata) thread CPU seconds of one step on rank ``RANK``."""
    started = time.thread_time()
    relayout = rank_relayout(plan, computed, RANK)
    laid_out = time.thread_time()
    pcp_stage_metadata(plan, common, computed, relayout,
                       torch.from_numpy(relayout.stage_positions), chunked_prefill=False)
    return laid_out - started, time.thread_time() - laid_out


def moved_bytes(plan, computed) -> dict:
    relayout = rank_relayout(plan, computed, RANK)
    row_bytes = HIDDEN * BF16_BYTES * TENSORS_MOVED
    received = (relayout.inbound.received_rows + relayout.outbound.received_rows) * row_bytes
    return {"exchanged_requests": relayout.exchanged_requests.tolist(),
            "rows_received_in": relayout.inbound.received_rows,
            "rows_received_out": relayout.outbound.received_rows,
            "parent_rows_per_rank": relayout.parent_rows,
            "stage_rows_per_rank": list(relayout.stage_row_counts),
            "received_mib_per_rank": received / 2**20,
            "received_vs_rank_hidden_states": received / (relayout.parent_rows * row_bytes)}


def summary(values_ms):
    p10, median, p90 = np.percentile(values_ms, [10, 50, 90])
    return {"p10": float(p10), "median": float(median), "p90": float(p90)}


def measure(rounds: int) -> dict:
    inputs = {name: (*prepared(counts, computed), computed)
              for name, (counts, computed) in CASES.items()}
    samples = {name: {"relayout": [], "stage_metadata": [], "total": []} for name in CASES}
    order = list(CASES)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            best = min((one_step(*inputs[name]) for _ in range(PASSES)), key=sum)
            samples[name]["relayout"].append(best[0] * 1e3)
            samples[name]["stage_metadata"].append(best[1] * 1e3)
            samples[name]["total"].append(sum(best) * 1e3)
    figures = {name: {f"{part}_ms": summary(values) for part, values in parts.items()}
               | {"tokens": int(sum(CASES[name][0])), "requests": len(CASES[name][0]),
                  "moved": moved_bytes(inputs[name][0], inputs[name][2])}
               for name, parts in samples.items()}
    targets = [{"figure": "relayout + stage metadata", "case": name, "limit_ms": TARGET_MS,
                "median_ms": figures[name]["total_ms"]["median"],
                "met": figures[name]["total_ms"]["median"] <= TARGET_MS} for name in CASES]
    return {"figures": figures, "targets": targets}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    parser.add_argument("--output", help="also write the JSON report here")
    add_load_arguments(parser)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds}; expected at least 1")
    if args.repeats < 0:
        parser.error(f"--repeats={args.repeats}; expected at least 0")
    report = run_until_quiet(lambda: {
        "benchmark": "pcp_relayout", "torch": torch.__version__, "numpy": np.__version__,
        "python": platform.python_version(), "cpu_count": os.cpu_count(), "pcp": PCP,
        "rank": RANK, "hidden": HIDDEN, "rounds": args.rounds, "passes": PASSES,
        **measure(args.rounds)}, max_load=args.max_load, repeats=args.repeats)
    met = sum(target["met"] for target in report["targets"])
    worst = max(report["targets"], key=lambda target: target["median_ms"])
    line = (f"pcp_relayout (pcp {PCP}): {met} of {len(report['targets'])} targets met; slowest "
            f"{worst['case']} {worst['median_ms']:.2f} ms per step (relayout + stage metadata); "
            f"{load_note(report)}")
    emit_report(report, line, output=args.output, as_json=args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
