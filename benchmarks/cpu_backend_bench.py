"""CPU backend benchmark and W8A8 tolerance measurement; prints JSON.

    python benchmarks/cpu_backend_bench.py --json             # prefill tokens/s, split vs
        unsplit, and transformers' eager forward on the same config/weights/tokens
    python benchmarks/cpu_backend_bench.py --w8a8-tolerance   # the measurement behind
        docs/tolerance.md and pytest_afd.golden.W8A8_ATOL / W8A8_RTOL

Batches are several requests of mixed lengths (half, quarter, eighth, eighth of the
batch) so that the token-balanced cut falls inside a request. Ratios are measured
side by side in one process.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np
import torch

from afd_split import BatchMetadata, plan_split
from pytest_afd.backends.base import PromptRequest, RunSettings
from pytest_afd.backends.cpu import (
    BlockPool,
    CpuBackend,
    Executor,
    PagedKVCache,
    build_model,
    named_config,
)

BATCH_SHARES = (0.5, 0.25, 0.125, 0.125)
DEFAULT_SIZES = (2048, 8192, 32768)
# transformers materialises [S, S] masks and index scores per request: skip longer ones.
TRANSFORMERS_MAX_REQUEST = 8192
# Indexer top-k large enough that every benchmark prompt attends densely (the
# exactness configuration the gates use); --sparse keeps the real 2048.
DENSE_TOPK = 1 << 17


def batch_lengths(total: int) -> list[int]:
    lengths = [int(total * share) for share in BATCH_SHARES]
    lengths[0] += total - sum(lengths)
    return lengths


def prompts_for(lengths: list[int], vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def time_ours(model, prompts: list[list[int]], policy: str, instrument: bool = False) -> float:
    cache = PagedKVCache(model.config)
    pool = BlockPool(cache)
    blocks = [pool.allocate(p, 0) for p in prompts]
    width = max(len(b.block_ids) for b in blocks)
    table = np.full((len(prompts), width), -1)
    for i, b in enumerate(blocks):
        table[i, : len(b.block_ids)] = b.block_ids
    lengths = [len(p) for p in prompts]
    metadata = BatchMetadata.from_requests(lengths, None, table, cache.block_size)
    plan = plan_split(lengths, policy=policy)
    ids = np.concatenate(prompts)
    started = time.perf_counter()
    Executor(model, cache).execute(ids, metadata, plan, instrument=instrument)
    return time.perf_counter() - started


def time_transformers(model, prompts: list[list[int]]) -> float | None:
    if max(len(p) for p in prompts) > TRANSFORMERS_MAX_REQUEST:
        return None
    started = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            model(torch.tensor([prompt]))
    return time.perf_counter() - started


def load_transformers(model):
    import transformers

    hf = {k: v for k, v in model.config.to_hf_dict().items() if k != "model_type"}
    reference = transformers.DeepseekV32ForCausalLM(transformers.DeepseekV32Config(**hf)).eval()
    reference.load_state_dict(model.weights, strict=True)
    return reference


def bench(sizes: list[int], seed: int, sparse: bool, with_transformers: bool) -> dict:
    config = named_config("reduced") if sparse else named_config("reduced", index_topk=DENSE_TOPK)
    model = build_model(config, seed)
    reference = load_transformers(model) if with_transformers else None
    time_ours(model, prompts_for([64, 64], config.vocab_size, seed), "token_balanced")  # warmup
    rows = []
    for total in sizes:
        lengths = batch_lengths(total)
        prompts = prompts_for(lengths, config.vocab_size, seed)
        unsplit = time_ours(model, prompts, "none")
        split = time_ours(model, prompts, "token_balanced")
        instrumented = time_ours(model, prompts, "token_balanced", instrument=True)
        row = {
            "tokens": total,
            "request_lengths": lengths,
            "unsplit_s": round(unsplit, 3),
            "split_s": round(split, 3),
            "unsplit_tokens_per_s": round(total / unsplit, 1),
            "split_tokens_per_s": round(total / split, 1),
            "split_over_unsplit_time": round(split / unsplit, 3),
            "instrumented_split_s": round(instrumented, 3),
            "instrumentation_overhead": round(instrumented / split - 1, 3),
        }
        if reference is not None:
            hf_time = time_transformers(reference, prompts)
            row["transformers_s"] = None if hf_time is None else round(hf_time, 3)
            row["transformers_tokens_per_s"] = None if hf_time is None else round(total / hf_time, 1)
            row["ours_speedup_vs_transformers"] = (
                None if hf_time is None else round(hf_time / unsplit, 2)
            )
            if hf_time is None:
                row["transformers_skipped"] = (
                    f"a request is longer than {TRANSFORMERS_MAX_REQUEST} tokens"
                )
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    return {
        "benchmark": "cpu_backend_prefill",
        "model": config.name,
        "index_topk": config.index_topk,
        "num_layers": config.num_hidden_layers,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "results": rows,
    }


# ---- W8A8 tolerance ---------------------------------------------------------
TOLERANCE_WORKLOADS = ((40, 300, 150), (1000,), (129, 129, 129, 129), (700, 64, 333, 5))
TOLERANCE_VARIANTS = {
    "token_balanced": RunSettings(block_size=32),
    "request_boundary": RunSettings(block_size=32, split_policy="request_boundary"),
    "token_balanced_align8_pcp2": RunSettings(block_size=32, split_align=8, pcp_size=2),
    "chunk128": RunSettings(block_size=32, chunk_size=128),
    "chunk256_split": RunSettings(block_size=32, chunk_size=256, max_num_seqs=2),
    "prefix_warm": RunSettings(block_size=32, prefix_caching=True),
}


def _logits(outputs) -> np.ndarray:
    return np.stack([r.logits for r in outputs.requests]).astype(np.float64)


def _shared_prefix_prompts(lengths, vocab: int, seed: int) -> list[PromptRequest]:
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, vocab, 96).tolist()
    return [
        PromptRequest(f"r{i}", tuple(prefix + rng.integers(0, vocab, n).tolist()))
        for i, n in enumerate(lengths)
    ]


def measure_w8a8(seeds: list[int], models: list[str]) -> dict:
    """Max |delta logits| of W8A8 runs that must agree (split/chunked/cached vs unsplit),
    and of W8A8 vs float32 (the quantization error itself)."""
    cases = []
    for model_name in models:
        for seed in seeds:
            model = build_model(named_config(model_name), seed)
            backend = CpuBackend(model, seed=seed)
            for workload in TOLERANCE_WORKLOADS:
                prompts = _shared_prefix_prompts(workload, model.config.vocab_size, seed)
                backend.reset_prefix_cache()
                base = RunSettings(block_size=32, split_policy="none")
                fp32 = _logits(backend.run(prompts, base))
                ref_run = backend.run(prompts, RunSettings(block_size=32, split_policy="none",
                                                           quantization="w8a8"))
                ref = _logits(ref_run)
                quant_err = np.abs(ref - fp32)
                cases.append({
                    "model": model_name, "seed": seed, "workload": list(workload),
                    "variant": "w8a8_vs_float32",
                    "max_abs": float(quant_err.max()),
                    "max_abs_over_ref_absmax": float(quant_err.max() / np.abs(fp32).max()),
                    "argmax_agree": float(np.mean(ref.argmax(1) == fp32.argmax(1))),
                })  # fmt: skip
                for variant, settings in TOLERANCE_VARIANTS.items():
                    settings = RunSettings(**{**settings.__dict__, "quantization": "w8a8"})
                    if settings.prefix_caching:
                        backend.reset_prefix_cache()
                        backend.run(prompts, settings)
                    out = _logits(backend.run(prompts, settings))
                    diff = np.abs(out - ref)
                    print(f"{model_name} seed {seed} {workload} {variant}: "
                          f"{float(np.abs(out - ref).max()):.3g}", file=sys.stderr, flush=True)
                    cases.append({
                        "model": model_name, "seed": seed, "workload": list(workload),
                        "variant": variant,
                        "max_abs": float(diff.max()),
                        "max_rel_where_abs_gt_1e-3": float(
                            (diff / np.maximum(np.abs(ref), 1e-3)).max()
                        ),
                        "argmax_agree": float(np.mean(out.argmax(1) == ref.argmax(1))),
                    })  # fmt: skip
    shape_cases = [c for c in cases if c["variant"] != "w8a8_vs_float32"]
    quant_cases = [c for c in cases if c["variant"] == "w8a8_vs_float32"]
    return {
        "measurement": "w8a8_tolerance",
        "num_cases": len(cases),
        "w8a8_shape_variation_max_abs": max(c["max_abs"] for c in shape_cases),
        "w8a8_shape_variation_bitwise_equal_cases": sum(c["max_abs"] == 0 for c in shape_cases),
        "w8a8_shape_variation_cases": len(shape_cases),
        "w8a8_shape_variation_p50_abs": float(np.median([c["max_abs"] for c in shape_cases])),
        "w8a8_vs_float32_max_abs": max(c["max_abs"] for c in quant_cases),
        "w8a8_vs_float32_argmax_agree_min": min(c["argmax_agree"] for c in quant_cases),
        "cases": cases,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document (default)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--sparse", action="store_true",
                        help="keep the real index_topk=2048 (sparse attention past 2048 tokens)")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--w8a8-tolerance", action="store_true")
    parser.add_argument("--tolerance-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tolerance-models", nargs="+", default=["reduced", "full"])
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.w8a8_tolerance:
        result = measure_w8a8(args.tolerance_seeds, args.tolerance_models)
    else:
        result = bench(args.sizes, args.seed, args.sparse, not args.no_transformers)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
