"""The parts of a result document: measurements, settings, workload, metrics, evidence.

Split from :mod:`pytest_afd.results.documents` (which re-exports every name here) so the
schema/validation/writing side and the document-building side each stay small.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pytest_afd.core.backend import RunOutputs, RunSettings
from pytest_afd.results.manifest import absent
from pytest_afd.stats.host import samples_of
from pytest_afd.stats.repetitions import summarize

# Request-level async MoE staging of the recipe: exactly two ubatches.
DEFAULT_ASYNC_MOE_STAGES = 2
PROMPT_LENGTH_PERCENTILES = (50, 90, 99)
NOT_MEASURED = "not measured by this case"
LAYOUT_FROM_TOPOLOGY = "taken from the topology's layout (manifest topology.cpu_emulation)"


def measurement(values: Sequence[float], unit: str) -> dict[str, Any]:
    """Every repetition plus its summary statistics (the schema's ``measurement``)."""
    return {
        "unit": unit,
        "repetitions": [float(v) for v in values],
        "stats": summarize(values).to_json(),
    }


def settings_json(
    settings: RunSettings,
    *,
    execution_mode: str | None = None,
    async_moe_stages: int = DEFAULT_ASYNC_MOE_STAGES,
) -> dict[str, Any]:
    """The result's ``settings`` object from a backend :class:`RunSettings`.

    ``execution_mode`` is ``"eager"`` or ``"graph"`` when the backend knows it;
    ``None`` records it as absent.
    """
    return {
        "split_policy": settings.split_policy,
        "quantization": settings.quantization,
        "scheduler": {
            "max_num_batched_tokens": settings.max_num_batched_tokens,
            "max_num_seqs": settings.max_num_seqs,
            "block_size": settings.block_size,
        },
        "execution_mode": absent("the backend did not report eager/graph mode")
        if execution_mode is None
        else execution_mode,
        "async_moe": {
            "enabled": settings.split_policy != "none",
            "stages": async_moe_stages if settings.split_policy != "none" else 1,
            "split_policy": settings.split_policy,
        },
        "chunked_prefill": {
            "enabled": settings.chunk_size is not None,
            "chunk_size": settings.chunk_size,
        },
        "prefix_cache": {"enabled": settings.prefix_caching},
        "expert_balancing": {"routing": settings.routing},
        "split_constraints": {
            name: absent(LAYOUT_FROM_TOPOLOGY) if value is None else value
            for name, value in (
                ("split_align", settings.split_align),
                ("pcp_size", settings.pcp_size),
            )
        },
        "instrumented": settings.instrument,
        "afd_processes": settings.afd_processes,
    }


def prompt_length_summary(lengths: Sequence[int], *, include_values: bool = True) -> dict[str, Any]:
    """Mean, percentiles, stddev, CV and min/max of prompt lengths (Stage C asks for them)."""
    if len(lengths) == 0:
        empty = dict.fromkeys(("min", "max", "mean", "stddev", "cv", "p50", "p90", "p99"))
        return {"count": 0, **({"values": []} if include_values else {}), **empty}
    arr = np.asarray(lengths, dtype=np.float64)
    stats = summarize(arr.tolist())
    p50, p90, p99 = (float(v) for v in np.percentile(arr, PROMPT_LENGTH_PERCENTILES))
    summary = {
        "count": len(lengths),
        "min": stats.min,
        "max": stats.max,
        "mean": stats.mean,
        "stddev": stats.stddev,
        "cv": stats.cv,
        "p50": p50,
        "p90": p90,
        "p99": p99,
    }
    if include_values:
        summary["values"] = [int(v) for v in lengths]
    return summary


EMPTY_TIMINGS_REASON = "the run timed no layer (its per-layer timings were empty)"


def timings_or_absent(timings: Mapping[str, Any] | None, reason: str) -> Any:
    """Per-layer timings, or the absent record: none at all gives ``reason``; a document
    without a single timed layer (``{"layers": [], "ubatches": []}``) is absent too, never
    a table of nothing."""
    if not timings:
        return absent(reason)
    if "layers" in timings and not timings["layers"]:
        return absent(EMPTY_TIMINGS_REASON)
    return timings


def workload_json(
    *,
    dataset_name: str,
    prompt_lengths: Sequence[int],
    seed: int | None,
    dataset_digest: str | None = None,
    arrival_process: str = "all_at_once",
    output_length: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    """The result's ``workload`` object (dataset identity, counts, arrival, lengths, seed)."""
    return {
        "dataset": {
            "name": dataset_name,
            "digest": dataset_digest
            if dataset_digest is not None
            else absent("the workload generator did not report a dataset digest"),
        },
        "request_count": len(prompt_lengths),
        "arrival_process": arrival_process,
        "prompt_lengths": prompt_length_summary(prompt_lengths),
        "output_length": output_length,
        "seed": seed if seed is not None else absent("the workload is not seeded (fixed input)"),
        **extra,
    }


def metrics_json(
    *,
    completed_requests: int | dict,
    failed_requests: int | dict,
    prefill_tokens_per_s: dict | None = None,
    request_throughput: dict | None = None,
    ttft_s: dict | None = None,
    peak_memory_bytes: dict | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The result's ``metrics`` object; a headline metric left ``None`` is recorded absent."""

    def _or_absent(value: dict | None) -> dict:
        return absent(NOT_MEASURED) if value is None else value

    return {
        "prefill_tokens_per_s": _or_absent(prefill_tokens_per_s),
        "request_throughput": _or_absent(request_throughput),
        "ttft_s": _or_absent(ttft_s),
        "completed_requests": completed_requests,
        "failed_requests": failed_requests,
        "peak_memory_bytes": _or_absent(peak_memory_bytes),
        **extra,
    }


TTFT_PERCENTILES = {"p50": 50, "p90": 90, "p95": 95, "p99": 99}


def metrics_from_runs(
    runs: Sequence[RunOutputs], *, peak_memory_bytes: dict | None = None
) -> dict[str, Any]:
    """Headline metrics from measured repetitions (one :class:`RunOutputs` each).

    Prefill throughput counts logical input tokens of completed requests per
    wall second; ``computed_tokens_per_s`` (newly computed, i.e. minus prefix
    hits) is added alongside. Completed/failed counts sum over repetitions.
    """
    if not runs:
        raise ValueError("metrics_from_runs() needs at least one run")
    tokens_per_s, computed_per_s, requests_per_s = [], [], []
    ttft_by_pct: dict[str, list[float]] = {name: [] for name in TTFT_PERCENTILES}
    completed = failed = 0
    for index, run in enumerate(runs):
        if run.wall_time_s <= 0:
            raise ValueError(f"run {index} has wall_time_s={run.wall_time_s}; expected > 0")
        done = [r for r in run.requests if r.error is None]
        completed += len(done)
        failed += len(run.requests) - len(done)
        logical = sum(r.num_prompt_tokens for r in done)
        tokens_per_s.append(logical / run.wall_time_s)
        computed_per_s.append((logical - sum(r.num_cached_tokens for r in done)) / run.wall_time_s)
        requests_per_s.append(len(done) / run.wall_time_s)
        ttfts = [r.ttft_s for r in done if r.ttft_s is not None]
        if ttfts:
            for name, pct in TTFT_PERCENTILES.items():
                ttft_by_pct[name].append(float(np.percentile(ttfts, pct)))
    ttft: dict | None = None
    if all(len(v) == len(runs) for v in ttft_by_pct.values()):
        ttft = {name: measurement(vals, "s") for name, vals in ttft_by_pct.items()}
    return metrics_json(
        completed_requests=completed,
        failed_requests=failed,
        prefill_tokens_per_s=measurement(tokens_per_s, "tokens/s"),
        request_throughput=measurement(requests_per_s, "requests/s"),
        ttft_s=ttft if ttft is not None else absent("the backend reported no per-request TTFT"),
        peak_memory_bytes=peak_memory_bytes
        if peak_memory_bytes is not None
        else reported_peak_memory(runs),
        computed_tokens_per_s=measurement(computed_per_s, "tokens/s"),
        **time_metrics(runs),
    )


def time_metrics(runs: Sequence[RunOutputs]) -> dict[str, Any]:
    """Wall and CPU seconds per repetition, when every run carries its host sample.

    CPU time (this process plus AFD ranks) is compared beside wall time: a
    loaded host stretches wall time much more than the CPU time of the work.
    """
    samples = samples_of(runs)
    if samples is None:
        return {}
    return {
        "wall_time_s": measurement([run.wall_time_s for run in runs], "s"),
        "cpu_time_s": measurement([sample.cpu_time_s for sample in samples], "s"),
    }


def reported_peak_memory(runs: Sequence[RunOutputs]) -> dict:
    """The runs' own peak-memory readings, or absent when any run lacks one."""
    readings = [run.peak_memory_bytes for run in runs]
    if any(value is None for value in readings):
        reasons = [run.peak_memory_absent_reason for run in runs if run.peak_memory_bytes is None]
        return absent(next((r for r in reasons if r), None)
                      or "the backend did not report peak memory for these runs")
    return measurement(readings, "bytes")


def per_rank_load(per_expert: Sequence[Sequence[int]], num_ep_ranks: int) -> list[list[int]]:
    """Sum per-expert routed tokens into contiguous EP-rank blocks, layer by layer."""
    loads = []
    for layer, experts in enumerate(per_expert):
        if len(experts) % num_ep_ranks:
            raise ValueError(
                f"layer {layer}: {len(experts)} experts cannot be spread evenly over {num_ep_ranks} EP ranks"
            )
        per_rank = len(experts) // num_ep_ranks
        loads.append(
            [int(sum(experts[r * per_rank : (r + 1) * per_rank])) for r in range(num_ep_ranks)]
        )
    return loads


NO_STEPS_REPORTED = "the backend reported no per-step split evidence for this run"


def token_evidence(
    steps: Sequence[Mapping[str, Any]], logical_prompt_tokens: int
) -> dict[str, Any]:
    """Real/padded totals, per-ubatch totals (summed over steps) and the worst step imbalance."""
    per_real: list[int] = []
    per_padded: list[int] = []
    imbalances = []
    for step in steps:
        for index, ubatch in enumerate(step["ubatches"]):
            if index == len(per_real):
                per_real.append(0)
                per_padded.append(0)
            per_real[index] += int(ubatch["num_real_tokens"])
            per_padded[index] += int(ubatch["num_padded_tokens"])
        if step["imbalance"] is not None:
            imbalances.append(float(step["imbalance"]))
    return {
        "logical_prompt_tokens": int(logical_prompt_tokens),
        "scheduled_real_tokens": sum(per_real),
        "padded_tokens": sum(per_padded),
        "per_ubatch_real_tokens": per_real,
        "per_ubatch_padded_tokens": per_padded,
        "max_imbalance": max(imbalances) if imbalances else None,
    }


def evidence_from_outputs(
    outputs: RunOutputs,
    *,
    routing: str,
    num_ep_ranks: int,
    requested_hit_ratio: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The result's ``evidence`` object from one representative run.

    The realized prefix-hit ratio comes from the runtime's per-request cached
    tokens (never from how the input was built).
    """
    logical = sum(r.num_prompt_tokens for r in outputs.requests)
    hits = sum(r.num_cached_tokens for r in outputs.requests)
    steps = [dict(step) for step in outputs.steps]
    # No steps is absent step evidence with its reason, never zero scheduled tokens.
    no_steps = None if steps else absent(outputs.steps_absent_reason or NO_STEPS_REPORTED)
    return {
        "steps": no_steps or steps,
        "tokens": no_steps or token_evidence(steps, logical),
        "prefix_cache": {
            "requested_hit_ratio": requested_hit_ratio
            if requested_hit_ratio is not None
            else absent("this case did not request a prefix-hit ratio"),
            "realized_hit_ratio": hits / logical
            if logical
            else absent("no prompt tokens were run"),
            "hit_tokens": hits,
            "computed_tokens": logical - hits,
        },
        "per_layer_timings": timings_or_absent(
            outputs.timings,
            "non-instrumented run (headline numbers come from runs without a profiler)"),
        "expert_load": {
            "routing": routing,
            "per_expert": [list(map(int, layer)) for layer in outputs.expert_load],
            "per_rank": per_rank_load(outputs.expert_load, num_ep_ranks),
            "num_ep_ranks": num_ep_ranks,
        }
        if outputs.expert_load
        else absent("the backend reported no expert load"),
        "profile": outputs.profile
        if outputs.profile
        else absent("no profiler traces were analysed for this run (instrumented runs with "
                    "traces only: docs/profiling.md)"),
        "device_metrics": outputs.device_metrics
        if outputs.device_metrics
        else absent("device metrics were not sampled (npu-smi during measured runs only)"),
        **extra,
    }
