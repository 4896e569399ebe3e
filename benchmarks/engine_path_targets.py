"""engine_path_bench's targets, context and summary line (issue 43), from its per-size rows.

Per layout and batch size, two host costs per step are reported side by side, so neither
is mistaken for the other:

* **deployed** (the target, ``met``): what the hook costs with its deployed split
  threshold (``AFD_SPLIT_MIN_TOKENS`` at ``DEFAULT_SPLIT_MIN_TOKENS``): below it the step
  runs unsplit and the hook only counts it; from it on the hook plans, splits, checks
  and guards the stage build (``deployed_split`` says which);
* **forced split** (``forced_split_*``, no target): the same step split whatever its size
  (threshold 0, as the gates and the harness's split-path cases run): plan, split,
  request-level check and the builder-state guard.

Each against 1% of the modelled NPU step of that many tokens, with the ratio to the
plugin's own request-boundary path at the same batch.
"""

from __future__ import annotations

import math

MAX_HOST_FRACTION = 0.01
"""Issues 33 and 43: the host cost per step is at most 1% of the modelled NPU step."""


def guarded_bytes_at(guard_sizes: dict, bound: int) -> int:
    """Bytes the bounded guard copies per step (each guarded buffer's first ``bound`` rows)."""
    return sum(min(rows, bound) * row_bytes for rows, row_bytes in guard_sizes["buffer_rows"])


def targets(rows: list[dict]) -> list[dict]:
    """One target per layout and batch size (the recipe's batch included): the deployed
    hook's host cost per step <= 1% of the NPU step of that many tokens; the forced split
    and the plugin's own path beside it."""
    return [{
        "name": f"host_cost_per_step_{row['layout']}_{row['batch']}_{row['num_requests']}",
        "layout": row["layout"],
        "batch": row["batch"],
        "num_requests": row["num_requests"],
        "num_tokens": row["num_tokens"],
        "max_fraction": MAX_HOST_FRACTION,
        "mode": f"deployed (AFD_SPLIT_MIN_TOKENS={row['split_min_tokens']})",
        "deployed_split": row["deployed_split"],
        "measured_fraction": row["host_fraction_of_npu_step"],
        "measured_fraction_p90": row["host_fraction_of_npu_step_p90"],
        "host_cost_thread_cpu_us": row["host_cost_thread_cpu_us"]["median"],
        "npu_step_us": row["npu_step_us"],
        "budget_us": row["npu_step_us"] * MAX_HOST_FRACTION,
        "met": row["host_fraction_of_npu_step"] <= MAX_HOST_FRACTION,
        "plugin_style_path_thread_cpu_us": row["plugin_style_path_thread_cpu_us"]["median"],
        "ratio_deployed_to_plugin_thread_cpu":
            row["ratio_deployed_to_plugin_thread_cpu"]["median"],
        # The forced split (threshold 0): reported, never the target.
        "forced_split_host_cost_thread_cpu_us": row["forced_host_cost_thread_cpu_us"]["median"],
        "forced_split_fraction": row["forced_host_fraction_of_npu_step"],
        "forced_split_within_budget": row["forced_host_fraction_of_npu_step"] <= MAX_HOST_FRACTION,
        "builder_state_guard_thread_cpu_us": row["builder_state_guard_thread_cpu_us"]["median"],
        "builder_state_guard_whole_buffers_thread_cpu_us":
            row["builder_state_guard_whole_buffers_thread_cpu_us"]["median"],
        "ratio_engine_to_plugin_thread_cpu": row["ratio_engine_to_plugin_thread_cpu"]["median"],
        "host_cost_over_plugin_path_thread_cpu_us":
            row["host_cost_over_plugin_path_thread_cpu_us"]["median"],
        "break_even_step_ms":
            row["forced_host_cost_thread_cpu_us"]["median"] / MAX_HOST_FRACTION / 1e3,
    } for row in rows]


def context(rows: list[dict], cost_model) -> dict:
    """Every size (no target): the forced split's host fraction of the calibrated
    ``CostModel`` step, ratio to the plugin path."""
    return {
        "cost_model": cost_model.to_evidence(),
        "per_layout_and_size": [{
            "layout": row["layout"], "batch": row["batch"], "num_requests": row["num_requests"],
            "num_tokens": row["num_tokens"], "modelled_step_us": round(row["modelled_step_us"], 1),
            "host_cost_thread_cpu_us": round(row["forced_host_cost_thread_cpu_us"]["median"], 1),
            "host_fraction": row["host_fraction_of_modelled_step"],
            "ratio_engine_to_plugin_thread_cpu": row["ratio_engine_to_plugin_thread_cpu"]["median"],
            **({} if row["plugin_splits"] else {
                "note": "the plugin does not split this batch (one request): its path is a "
                        "no-op, the engine path splits it"}),
        } for row in rows],
    }


def suggested_split_min_tokens(rows: list[dict], npu_model, percentile: str = "p90") -> int:
    """A threshold that leaves unsplit every measured size whose forced split exceeds 1% of
    its step on this host (at ``percentile`` of the rounds): the largest break-even of those
    sizes' costs (cost / 1% x the deployment's tokens/s, past the size itself since its cost
    is over its budget). 0 when every forced split fits. Tuning aid for another host."""
    over = [row["forced_host_cost_thread_cpu_us"][percentile] * 1e-6 for row in rows
            if row["forced_host_cost_thread_cpu_us"][percentile] * 1e-6
            > npu_model.step_s(row["num_tokens"]) * MAX_HOST_FRACTION]
    return max((math.ceil(cost_s / MAX_HOST_FRACTION * npu_model.deployment_tokens_per_s)
                for cost_s in over), default=0)


def one_line(report: dict, load_note: str) -> str:
    entries = report["targets"]
    met = sum(entry["met"] for entry in entries)
    forced = sum(entry["forced_split_within_budget"] for entry in entries)
    fractions = ", ".join(
        f"{entry['layout'].removesuffix('-standin')}/{entry['num_tokens']}tok="
        f"{entry['measured_fraction']:.1e}{'' if entry['met'] else '!'} "
        f"({'split' if entry['deployed_split'] else 'unsplit'} "
        f"{entry['host_cost_thread_cpu_us']:.0f} us of {entry['budget_us']:.0f}; forced split "
        f"{entry['forced_split_host_cost_thread_cpu_us']:.0f} us incl. guard "
        f"{entry['builder_state_guard_thread_cpu_us']:.0f} us, "
        f"x{entry['ratio_engine_to_plugin_thread_cpu']:.2f} plugin path)"
        for entry in entries)
    return (f"engine_path_bench: {met}/{len(entries)} targets met (deployed hook, "
            f"AFD_SPLIT_MIN_TOKENS={report['split_min_tokens']}: host cost <= "
            f"{MAX_HOST_FRACTION:.0%} of the NPU step at each batch size, "
            f"{report['npu_step_model']['source']}, thread CPU; ! = not met; forced split "
            f"within 1% at {forced}/{len(entries)}) [{load_note}]: {fractions}")
