"""Import ``vllm bench serve --save-result --save-detailed`` JSON as harness results.

Runs made by hand on a cluster then join the same reports as harness runs.
Each input file is one measured repetition of the same case; the per-request
lists that only ``--save-detailed`` writes (``input_lens``, ``ttfts``,
``errors``) are required because TTFT percentiles and prompt-length statistics
are recomputed from them. What ``vllm bench serve`` does not measure (split
evidence, expert load, device memory) is recorded as absent with the reason.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pytest_afd.core.backend import RunSettings
from pytest_afd.results import documents as results
from pytest_afd.results.manifest import absent, collect_manifest
from pytest_afd.serving.prometheus import (
    MetricsFormatError,
    PrefixCacheDelta,
    ServerCounters,
    prefix_cache_delta,
)
from pytest_afd.topology.spec import DEFAULT_DEVICES_PER_NODE, parse_topology

BACKEND_NAME = "vllm-ascend"
SOURCE = "vllm bench serve"
DETAILED_FIELDS = ("input_lens", "output_lens", "ttfts", "errors")
SUMMARY_FIELDS = ("duration", "completed", "failed", "total_input_tokens", "request_throughput")
TTFT_PERCENTILES = {"p50": 50, "p90": 90, "p95": 95, "p99": 99}
UNIT_BURSTINESS = 1.0  # burstiness 1 is a Poisson process in vllm bench serve
NOT_IN_BENCH = "vllm bench serve does not record it"


class BenchImportError(ValueError):
    """A file is not a usable ``vllm bench serve`` result; the message says which and why."""


def load_bench_file(path: str | Path) -> list[dict[str, Any]]:
    """Every result object in a file (``--append-result`` writes one JSON object per line)."""
    file = Path(path)
    text = file.read_text()
    try:
        return [json.loads(text)]
    except json.JSONDecodeError:
        pass
    documents = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            documents.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise BenchImportError(f"{file}: line {number} is not JSON: {error}") from error
    if not documents:
        raise BenchImportError(f"{file}: empty file")
    return documents


def check_bench(doc: Mapping[str, Any], where: str) -> None:
    if not isinstance(doc, Mapping):
        raise BenchImportError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    missing = [name for name in SUMMARY_FIELDS if name not in doc]
    if missing:
        raise BenchImportError(f"{where}: not a vllm bench serve result (missing {missing})")
    missing_detail = [name for name in DETAILED_FIELDS if name not in doc]
    if missing_detail:
        raise BenchImportError(
            f"{where}: missing per-request fields {missing_detail}; re-run vllm bench serve "
            "with --save-result --save-detailed"
        )
    lengths = {name: len(doc[name]) for name in ("input_lens", "ttfts", "errors")}
    if len(set(lengths.values())) != 1:
        raise BenchImportError(f"{where}: per-request lists differ in length {lengths}")
    if not doc["duration"] > 0:
        raise BenchImportError(f"{where}: duration={doc['duration']!r}; expected > 0 s")


def succeeded(doc: Mapping[str, Any]) -> list[bool]:
    """vLLM leaves ``error`` empty for a request that completed."""
    return [not error for error in doc["errors"]]


def arrival_description(doc: Mapping[str, Any]) -> str:
    rate = doc.get("request_rate", "inf")
    concurrency = doc.get("max_concurrency")
    suffix = f", max_concurrency={concurrency}" if concurrency is not None else ""
    if rate in ("inf", None) or (isinstance(rate, float) and math.isinf(rate)):
        return f"all-at-once{suffix}"
    burstiness = float(doc.get("burstiness", UNIT_BURSTINESS))
    if burstiness == UNIT_BURSTINESS:
        return f"poisson(rate={rate} req/s){suffix}"
    return f"gamma(rate={rate} req/s, burstiness={burstiness}){suffix}"


def _ttft_measurements(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    per_percentile: dict[str, list[float]] = {name: [] for name in TTFT_PERCENTILES}
    for doc in docs:
        ttfts = [ttft for ttft, ok in zip(doc["ttfts"], succeeded(doc), strict=True) if ok]
        if not ttfts:
            return absent("no request completed in at least one repetition")
        for name, percentile in TTFT_PERCENTILES.items():
            per_percentile[name].append(float(np.percentile(ttfts, percentile)))
    return {name: results.measurement(values, "s") for name, values in per_percentile.items()}


def bench_metrics(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Headline metrics with one repetition per bench file (RFC §3: input tokens/s, TTFT)."""
    return results.metrics_json(
        completed_requests=sum(int(doc["completed"]) for doc in docs),
        failed_requests=sum(int(doc["failed"]) for doc in docs),
        prefill_tokens_per_s=results.measurement(
            [doc["total_input_tokens"] / doc["duration"] for doc in docs], "tokens/s"),
        request_throughput=results.measurement([doc["request_throughput"] for doc in docs], "requests/s"),
        ttft_s=_ttft_measurements(docs),
        peak_memory_bytes=absent(f"device memory: {NOT_IN_BENCH}"),
    )


def bench_workload(doc: Mapping[str, Any], dataset_name: str, seed: int | None) -> dict[str, Any]:
    output_lens = doc["output_lens"] if isinstance(doc["output_lens"], list) else []
    return results.workload_json(
        dataset_name=dataset_name,
        prompt_lengths=[int(length) for length in doc["input_lens"]],
        seed=seed,
        arrival_process=arrival_description(doc),
        output_length=max(output_lens, default=0),
        num_prompts=doc.get("num_prompts", len(doc["input_lens"])),
    )


def bench_evidence(realized: PrefixCacheDelta | None, requested_hit_ratio: float | None) -> dict[str, Any]:
    if realized is None or realized.hit_ratio is None:
        prefix_cache: dict[str, Any] = absent(
            "no /metrics prefix-cache counters were scraped around the bench run")
    else:
        prefix_cache = {
            "requested_hit_ratio": requested_hit_ratio if requested_hit_ratio is not None
            else absent("this run did not request a prefix-hit ratio"),
            "realized_hit_ratio": realized.hit_ratio,
            "hit_tokens": int(realized.hit_tokens),
            "computed_tokens": int(realized.queried_tokens - realized.hit_tokens),
        }
    return {
        "steps": absent(f"per-step split evidence: {NOT_IN_BENCH}"),
        "tokens": absent(f"real/padded ubatch tokens: {NOT_IN_BENCH}"),
        "prefix_cache": prefix_cache,
        "per_layer_timings": absent(f"per-layer timings: {NOT_IN_BENCH}"),
        "expert_load": absent(f"expert load: {NOT_IN_BENCH}"),
    }


def import_bench_runs(
    paths: Sequence[str | Path],
    *,
    case_id: str,
    settings: RunSettings,
    manifest: Mapping[str, Any],
    dataset_name: str | None = None,
    case_kind: str = "benchmark",
    seed: int = 0,
    warmups: int = 0,
    realized_prefix_cache: PrefixCacheDelta | None = None,
    requested_hit_ratio: float | None = None,
    labels: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One validated result document; every bench result found is one repetition."""
    docs: list[dict[str, Any]] = []
    for path in paths:
        for index, doc in enumerate(load_bench_file(path)):
            check_bench(doc, f"{path}[{index}]")
            docs.append(doc)
    if not docs:
        raise BenchImportError("no vllm bench serve result files given")
    workloads = {json.dumps(doc["input_lens"]) for doc in docs}
    if len(workloads) != 1:
        raise BenchImportError(
            f"the {len(docs)} bench results ran different prompt lengths; repetitions of one case "
            "must share the workload")
    first = docs[0]
    doc = results.build_result(
        case_id=case_id,
        case_kind=case_kind,
        backend=BACKEND_NAME,
        settings=results.settings_json(settings, execution_mode="eager"),
        manifest=manifest,
        workload=bench_workload(first, dataset_name or first.get("label") or first["model_id"], seed),
        protocol={"seed": seed, "warmups": warmups, "repetitions": len(docs), "run_order": "fixed",
                  "source": SOURCE, "source_files": [str(path) for path in paths],
                  "source_dates": [str(bench.get("date")) for bench in docs]},
        metrics=bench_metrics(docs),
        evidence=bench_evidence(realized_prefix_cache, requested_hit_ratio),
        labels=labels,
        notes=f"imported from {SOURCE} results (model_id={first.get('model_id')!r}, "
              f"backend={first.get('backend')!r})",
    )
    results.validate_result(doc)
    return doc


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_afd.serving.bench_import",
        description="Import vllm bench serve --save-result --save-detailed JSON into the result schema.")
    parser.add_argument("files", nargs="+", type=Path, help="bench result files (one repetition each)")
    parser.add_argument("--case-id", required=True)
    parser.add_argument("--case-kind", default="benchmark", choices=results.CASE_KINDS)
    parser.add_argument("--npu-topology", required=True)
    parser.add_argument("--devices-per-node", type=int, default=DEFAULT_DEVICES_PER_NODE)
    parser.add_argument("--model-name", default=None, help="default: the bench file's model_id")
    parser.add_argument("--dataset-name", default=None)
    parser.add_argument("--split-policy", default="request_boundary")
    parser.add_argument("--chunk-size", type=int, default=None)
    parser.add_argument("--prefix-caching", action="store_true")
    parser.add_argument("--routing", default="natural")
    parser.add_argument("--quantization", default="w8a8")
    parser.add_argument("--max-num-batched-tokens", type=int, default=RunSettings.max_num_batched_tokens)
    parser.add_argument("--max-num-seqs", type=int, default=RunSettings.max_num_seqs)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmups", type=int, default=0)
    parser.add_argument("--results-dir", type=Path, default=Path("afd-results"))
    parser.add_argument("--metrics-before", type=Path, default=None,
                        help="/metrics text saved before the bench run (curl -s HOST:PORT/metrics)")
    parser.add_argument("--metrics-after", type=Path, default=None,
                        help="/metrics text saved after the bench run")
    parser.add_argument("--requested-hit-ratio", type=float, default=None)
    return parser


def realized_from_scrapes(before: Path, after: Path) -> PrefixCacheDelta:
    """Realized prefix-cache work between two saved ``/metrics`` scrapes."""
    return prefix_cache_delta(ServerCounters.from_text(before.read_text()),
                              ServerCounters.from_text(after.read_text()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if (args.metrics_before is None) != (args.metrics_after is None):
        parser.error("--metrics-before and --metrics-after go together")
    try:
        path = _import(args)
    except (BenchImportError, MetricsFormatError, results.ResultValidationError, ValueError,
            OSError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    print(path)
    return 0


def _import(args: argparse.Namespace) -> Path:
    settings = RunSettings(split_policy=args.split_policy, chunk_size=args.chunk_size,
                           prefix_caching=args.prefix_caching, routing=args.routing,
                           quantization=args.quantization,
                           max_num_batched_tokens=args.max_num_batched_tokens,
                           max_num_seqs=args.max_num_seqs)
    first = load_bench_file(args.files[0])[0]
    protocol = {"seed": args.seed, "warmups": args.warmups, "repetitions": len(args.files),
                "run_order": "fixed", "instrumented": False, "routing": args.routing}
    manifest = collect_manifest(
        topology=parse_topology(args.npu_topology), backend_name=BACKEND_NAME,
        backend_description={"imported_from": SOURCE},
        model_name=args.model_name or str(first.get("model_id")), protocol=protocol,
        emulated=False, devices_per_node=args.devices_per_node)
    realized = (realized_from_scrapes(args.metrics_before, args.metrics_after)
                if args.metrics_before is not None else None)
    doc = import_bench_runs(args.files, case_id=args.case_id, settings=settings, manifest=manifest,
                            dataset_name=args.dataset_name, case_kind=args.case_kind,
                            seed=args.seed, warmups=args.warmups, realized_prefix_cache=realized,
                            requested_hit_ratio=args.requested_hit_ratio)
    return results.write_result(results.result_path(args.results_dir, args.case_id), doc)


if __name__ == "__main__":
    sys.exit(main())
