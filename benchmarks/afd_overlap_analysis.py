"""Per-case entries and derived ratios of the AFD overlap benchmark (no runtime needed)."""

from __future__ import annotations

import statistics

import numpy as np
from afd_overlap_evidence import span_cost_s, summarize_instrumented
from afd_overlap_stats import dispersion

from afd_split.plan.cost import modelled_plan_cost


def case_entry(plan, lengths, cost_model, runs, instrumented_runs) -> dict:
    evidence = plan.to_evidence()
    modelled = modelled_plan_cost(cost_model, np.asarray(lengths), None, plan.split_token)
    ranks = list(runs[0]["cpu_time_s"])
    step = dispersion([r["step_time_s"] for r in runs])
    attention = next(rank for rank in ranks if rank.startswith("Attention"))
    attention_cpu = statistics.median(r["cpu_time_s"][attention] for r in runs)
    return {
        "split_token": plan.split_token,
        "boundary_request": plan.boundary_request,
        "imbalance": evidence["imbalance"],
        "row_imbalance": evidence["row_imbalance"],
        "ubatch_tokens": [u["num_real_tokens"] for u in evidence["ubatches"]],
        "step_time_s": step,
        # Process CPU seconds per rank in the same headline steps: the work, load-independent.
        "cpu_time_s": {
            rank: dispersion([r["cpu_time_s"][rank] for r in runs]) for rank in ranks
        },
        # Attention CPU / step wall: well below its usual value means the rank lost its core.
        "attention_cpu_share": attention_cpu / step["median"],
        "involuntary_switches": {
            rank: statistics.median(r["involuntary_switches"][rank] for r in runs) for rank in ranks
        },
        "instrumented": summarize_instrumented(instrumented_runs) if instrumented_runs else None,
        "modelled_makespan_s": modelled["makespan_s"],
    }


def modelled_step_ratio(numerator: dict, denominator: dict) -> float | None:
    """The modelled ratio once the work no split touches is added to both sides.

    Each side: its measured whole-batch thread-CPU seconds (embedding, dense
    layers, final; instrumented rounds) plus the cost model's MoE-layer makespan.
    The gap between ``modelled`` and this is the dilution by unsplit work; the
    gap between this and the measured ratio is transfer latency, scheduling and
    interference.
    """
    if numerator["instrumented"] is None or denominator["instrumented"] is None:
        return None
    sides = [
        case["instrumented"]["whole_batch_cpu_s"] + case["modelled_makespan_s"]
        for case in (numerator, denominator)
    ]
    return sides[0] / sides[1]


def instrumented_ratio(numerator: dict, denominator: dict, key: str) -> float | None:
    """Ratio of two cases' instrumented-round medians of ``key`` (None: not instrumented)."""
    if numerator["instrumented"] is None or denominator["instrumented"] is None:
        return None
    return numerator["instrumented"][key] / denominator["instrumented"][key]


def profiler_overhead(measured) -> dict:
    med = statistics.median
    per_case = [
        med(r["step_time_s"] for r in measured["instrumented"][key])
        / med(t for r in measured["headline"][key] for t in r["step_times_s"]) - 1.0
        for key in measured["plans"] if measured["instrumented"][key]
    ]  # fmt: skip
    per_span = span_cost_s()
    step_median = med(
        t for runs in measured["headline"].values() for r in runs for t in r["step_times_s"]
    )
    return {
        "median": med(per_case) if per_case else None,
        "span_cost_s": per_span,
        "spans_per_step": measured["spans_per_step"],
        "direct_overhead_fraction": per_span * measured["spans_per_step"] / step_median,
    }
