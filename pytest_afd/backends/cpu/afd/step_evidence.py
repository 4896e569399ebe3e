"""The evidence of one AFD step, built by the parent from every rank's spans.

Definitions (docs/afd-runtime.md has the long form):
- step time: first Attention-rank span start to last Attention-rank span end.
- exposed bubble: time Attention ranks spent blocked on e2a results (``wait``
  spans), i.e. expert work the other ubatch's attention did not hide; the
  largest over Attention ranks (each rank's bubble is on its own critical path).
- critical path: the chain of dependent spans that ended the step, walked back
  across ranks through the messages that ended each wait; its busy time by kind
  says which side the step waited for.
- overlap fraction: share of the lighter role's busy time that ran while the
  other role was busy.
- straggler time: per (MoE layer, ubatch), slowest FFN rank's routed-expert
  time minus the mean over FFN ranks, summed. With one FFN rank there is no
  other rank to straggle against: an absent record with that reason, never 0
  (a 0 would read as "the FFN ranks were balanced").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pytest_afd.backends.cpu.afd.evidence import (
    FFN_IDLE,
    ROUTED_MOE,
    WAIT,
    Span,
    critical_path,
    load_stats,
    overlap_fraction,
    per_layer_table,
    totals_by_kind,
)
from pytest_afd.core.absent import absent

EVIDENCE_VERSION = 1
# A straggler is one FFN rank slower than the others: it needs at least two.
MIN_STRAGGLER_RANKS = 2
ONE_FFN_RANK = ("one FFN rank: a straggler across FFN ranks needs at least two, "
                "so there is no other rank to compare with")


def _expert_load_evidence(
    expert_loads: Sequence[Sequence[Sequence[int]]], expert_owner: np.ndarray, num_ffn: int
) -> dict:
    """Per MoE layer: per-expert and per-FFN-rank load statistics over all Attention ranks."""
    if not expert_loads or not expert_loads[0]:
        return {
            "per_layer": [],
            "worst_expert_max_over_mean": None,
            "worst_rank_max_over_mean": None,
        }
    per_expert = np.sum(np.asarray(expert_loads, dtype=np.int64), axis=0)  # [layers, experts]
    per_layer = []
    for index, counts in enumerate(per_expert):
        rank_load = np.bincount(expert_owner, weights=counts, minlength=num_ffn)
        per_layer.append(
            {
                "moe_layer": index,
                "expert": load_stats(counts),
                "ffn_rank": load_stats(rank_load),
                "ffn_rank_tokens": rank_load.astype(int).tolist(),
            }
        )
    expert_ratios = [e["expert"]["max_over_mean"] or 0.0 for e in per_layer]
    rank_ratios = [e["ffn_rank"]["max_over_mean"] or 0.0 for e in per_layer]
    return {
        "per_layer": per_layer,
        "worst_expert_max_over_mean": max(expert_ratios),
        "worst_rank_max_over_mean": max(rank_ratios),
    }


def _straggler_s(ffn_spans: Mapping[int, list[Span]]) -> float | dict:
    """Sum over (layer, ubatch) of max - mean routed-expert time across FFN ranks.

    An absent record (:func:`pytest_afd.core.absent.absent`) with fewer than
    :data:`MIN_STRAGGLER_RANKS` FFN ranks: undefined is not 0.
    """
    if len(ffn_spans) < MIN_STRAGGLER_RANKS:
        return absent(ONE_FFN_RANK)
    per_key: dict[tuple[int, int], list[float]] = {}
    for spans in ffn_spans.values():
        own: dict[tuple[int, int], float] = {}
        for span in spans:
            if span.kind == ROUTED_MOE:
                own[(span.layer, span.ubatch)] = (
                    own.get((span.layer, span.ubatch), 0.0) + span.duration
                )
        for key, value in own.items():
            per_key.setdefault(key, []).append(value)
    total = 0.0
    for values in per_key.values():
        padded = values + [0.0] * (len(ffn_spans) - len(values))
        total += max(padded) - float(np.mean(padded))
    return total


def _rank_name(topology, global_rank: int) -> str:
    if global_rank < topology.num_attention:
        return topology.attention_name(global_rank)
    return topology.ffn_name(global_rank - topology.num_attention)


def step_evidence(
    *,
    topology,
    spans: Mapping[int, list[Span]],
    plans: Sequence,
    expert_loads: Sequence[Sequence[Sequence[int]]],
    ffn_routed_rows: Mapping[int, int],
    step_time_s: float,
    instrumented: bool,
    cpu_time_s: Mapping[int, float],
    involuntary_switches: Mapping[int, int] | None = None,
) -> dict:
    """JSON-able evidence of one step; timing detail only when the step was instrumented."""
    attention_ranks = list(range(topology.num_attention))
    ffn_ranks = [topology.ffn_global_rank(f) for f in range(topology.num_ffn)]
    evidence: dict = {
        "version": EVIDENCE_VERSION,
        "topology": {"num_attention": topology.num_attention, "num_ffn": topology.num_ffn},
        "instrumented": instrumented,
        "step_time_s": step_time_s,
        "plans": [plan.to_evidence() for plan in plans],
        "load": _expert_load_evidence(expert_loads, topology.expert_owner(), topology.num_ffn),
        "ffn_rows_served": {
            topology.ffn_name(r - topology.num_attention): n for r, n in ffn_routed_rows.items()
        },
        # CPU seconds each rank's process used during the step (all its threads). On a
        # shared host, Attention busy wall time well above its CPU time means the OS
        # ran something else: interference, not the split, explains that part.
        "cpu_time_s": {_rank_name(topology, r): t for r, t in sorted(cpu_time_s.items())},
        # Preemptions of each rank's process in the step (getrusage ru_nivcsw): a
        # direct count of the host's interference.
        "involuntary_switches": {
            _rank_name(topology, r): n for r, n in sorted((involuntary_switches or {}).items())
        },
    }
    if not instrumented:
        return evidence
    attention_spans = [s for r in attention_ranks for s in spans[r]]
    ffn_spans = [s for r in ffn_ranks for s in spans[r]]
    bubble_by_rank = {
        r: sum(s.duration for s in spans[r] if s.kind == WAIT) for r in attention_ranks
    }
    idle_by_rank = {r: sum(s.duration for s in spans[r] if s.kind == FFN_IDLE) for r in ffn_ranks}
    evidence.update(
        {
            "exposed_bubble_s": max(bubble_by_rank.values()),
            "ffn_idle_s": max(idle_by_rank.values()),
            "overlap_fraction": overlap_fraction(attention_spans, ffn_spans),
            "straggler_s": _straggler_s({r: spans[r] for r in ffn_ranks}),
            **critical_path({r: spans[r] for r in attention_ranks + ffn_ranks}),
            "totals_cpu_s": {
                "attention": totals_by_kind(attention_spans, cpu=True),
                "ffn": totals_by_kind(ffn_spans, cpu=True),
            },
            "totals_s": {
                "attention": totals_by_kind(attention_spans),
                "ffn": totals_by_kind(ffn_spans),
            },
            "per_layer": {
                "attention": per_layer_table(attention_spans),
                "ffn": per_layer_table(ffn_spans),
            },
            "per_layer_cpu": {
                "attention": per_layer_table(attention_spans, cpu=True),
                "ffn": per_layer_table(ffn_spans, cpu=True),
            },
        }
    )
    return evidence
