"""Evidence helpers of the AFD overlap benchmark: cost-model samples, profiler cost, summaries."""

from __future__ import annotations

import statistics
import time

import numpy as np

from afd_split.plan.cost import StageSample, attended_keys_per_row
from pytest_afd.backends.cpu.afd.evidence import ATTENTION, SENDER_KIND, WAIT_KINDS, Timeline
from pytest_afd.core.absent import is_absent


def ubatch_keys(plan) -> list[int]:
    """Attended keys of each ubatch's real rows (fresh prefill: no computed context)."""
    keys = attended_keys_per_row(np.asarray(plan.num_scheduled_tokens), None, None)
    return [int(keys[u.token_slice].sum()) for u in plan.ubatches]


def calibration_samples(evidence, plan) -> list[StageSample]:
    """Per (MoE layer, ubatch): rows, keys and the stage's thread-CPU seconds.

    CPU time, not wall time: on a shared host wall time includes whatever else
    the OS ran, and a cost model fitted to that noise would steer the cut by it.
    """
    keys = ubatch_keys(plan)
    table = evidence["per_layer_cpu"]
    ffn_rows = {(r["layer"], r["ubatch"]): r for r in table["ffn"]}
    samples = []
    for row in table["attention"]:
        if row["ubatch"] < 0 or (row["layer"], row["ubatch"]) not in ffn_rows:
            continue
        ffn = ffn_rows[(row["layer"], row["ubatch"])]
        samples.append(
            StageSample(
                num_rows=plan.ubatches[row["ubatch"]].num_rows,
                num_keys=keys[row["ubatch"]],
                attention_s=row.get("attention", 0.0) + row.get("route", 0.0),
                expert_s=ffn.get("routed_moe", 0.0) + ffn.get("shared_moe", 0.0),
                transfer_s=row.get("dispatch", 0.0) + ffn.get("recv", 0.0) + ffn.get("send", 0.0),
            )
        )
    return samples


SPAN_COST_SAMPLES = 20_000


def span_cost_s() -> float:
    """Seconds one instrumentation span costs (two clocks read twice, one append).

    Measured directly because the end-to-end overhead (instrumented vs headline
    medians) is below this host's run-to-run noise.
    """
    timeline = Timeline(True)
    started = time.perf_counter()
    for _ in range(SPAN_COST_SAMPLES):
        with timeline.span(ATTENTION, 0, 0):
            pass
    return (time.perf_counter() - started) / SPAN_COST_SAMPLES


def per_ubatch_times(evidence) -> dict:
    """Attention-side and FFN-side busy seconds per ubatch, summed over MoE layers."""
    out = {"attention_s": {}, "expert_s": {}}
    for row in evidence["per_layer"]["attention"]:
        if row["ubatch"] >= 0:
            key = str(row["ubatch"])
            value = row.get("attention", 0.0) + row.get("route", 0.0)
            out["attention_s"][key] = out["attention_s"].get(key, 0.0) + value
    for row in evidence["per_layer"]["ffn"]:
        key = str(row["ubatch"])
        value = row.get("routed_moe", 0.0) + row.get("shared_moe", 0.0)
        out["expert_s"][key] = out["expert_s"].get(key, 0.0) + value
    return out


WHOLE_BATCH_KINDS = ("embed", "final")


def whole_batch_cpu_s(evidence) -> float:
    """Attention-rank thread-CPU seconds of the work no split touches.

    Embedding, the dense layers (run on the whole batch) and the final norm and
    logits: the same on both sides of a policy ratio, so they dilute it.
    """
    totals = evidence["totals_cpu_s"]["attention"]
    dense = sum(
        value
        for row in evidence["per_layer_cpu"]["attention"]
        if row["ubatch"] < 0
        for kind, value in row.items()
        if kind not in ("layer", "ubatch")
    )
    return dense + sum(totals.get(kind, 0.0) for kind in WHOLE_BATCH_KINDS)


def cpu_replay_s(spans_by_rank) -> float:
    """The step replayed with every busy span lasting its thread-CPU seconds.

    Each rank runs its spans in the recorded order; a wait (Attention ``wait``,
    FFN ``ffn_idle``) ends when the peer's matching send ended in the replay.
    What remains is the step's own work and its dependencies, without the time
    the OS gave other processes and without transfer latency: the measured step
    time over this is the part of the ratio that the host, not the split, sets.
    """
    clock = dict.fromkeys(spans_by_rank, 0.0)
    position = dict.fromkeys(spans_by_rank, 0)
    sent: dict[tuple, float] = {}
    progressed = True
    while progressed:
        progressed = False
        for rank, spans in spans_by_rank.items():
            while position[rank] < len(spans):
                span = spans[position[rank]]
                if span.kind in WAIT_KINDS:
                    key = (span.peer, SENDER_KIND[span.kind], span.layer, span.ubatch, rank)
                    if key not in sent:
                        break  # blocked until the peer's replay reaches that send
                    clock[rank] = max(clock[rank], sent[key])
                else:
                    clock[rank] += span.cpu
                    sent[(rank, span.kind, span.layer, span.ubatch, span.peer)] = clock[rank]
                position[rank] += 1
                progressed = True
    blocked = [rank for rank, spans in spans_by_rank.items() if position[rank] < len(spans)]
    if blocked:
        raise ValueError(f"cpu replay: ranks {blocked} wait for a send no rank recorded")
    return max(clock.values())


def median_or_absent(values: list) -> float | dict:
    """Median of the measured values; the absent record itself when no run measured one
    (the straggler with one FFN rank: unknown, never a median of 0)."""
    measured = [v for v in values if not is_absent(v)]
    return statistics.median(measured) if measured else values[0]


def summarize_instrumented(runs) -> dict:
    med = statistics.median
    last = runs[-1]
    return {
        "step_time_s": med(r["step_time_s"] for r in runs),
        "exposed_bubble_s": med(r["exposed_bubble_s"] for r in runs),
        "ffn_idle_s": med(r["ffn_idle_s"] for r in runs),
        "overlap_fraction": med(r["overlap_fraction"] for r in runs),
        "critical_path_s": med(r["critical_path_s"] for r in runs),
        "critical_path_by_kind_s": last["critical_path_by_kind_s"],
        "attention_busy_cpu_s": med(
            sum(v for k, v in r["totals_cpu_s"]["attention"].items() if k != "wait") for r in runs
        ),
        "attention_busy_s": med(
            sum(v for k, v in r["totals_s"]["attention"].items() if k != "wait") for r in runs
        ),
        "ffn_busy_s": med(
            sum(v for k, v in r["totals_s"]["ffn"].items() if k != "ffn_idle") for r in runs
        ),
        "whole_batch_cpu_s": med(whole_batch_cpu_s(r) for r in runs),
        "cpu_replay_s": med(r["cpu_replay_s"] for r in runs),
        "per_ubatch": per_ubatch_times(last),
        "straggler_s": median_or_absent([r["straggler_s"] for r in runs]),
        "worst_expert_max_over_mean": last["load"]["worst_expert_max_over_mean"],
        "mean_expert_cv": float(
            np.mean([layer["expert"]["cv"] or 0.0 for layer in last["load"]["per_layer"]])
        ),
    }


