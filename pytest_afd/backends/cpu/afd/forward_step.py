"""One AFD forward step as the parent sees it: its inputs checked, its commands, its results.

:class:`~pytest_afd.backends.cpu.afd.runtime.AfdRuntime` owns the ranks; this module
holds what is pure about a step, so it can be read (and tested) without processes:
every batch and the injected fault are rejected by name before any rank sees them,
each rank gets one forward command, and the replies become one result per Attention
rank with the step's evidence attached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from afd_split import SplitPlan
from afd_split.checks.metadata import BatchMetadata
from pytest_afd.backends.cpu.afd.evidence import Span, as_spans
from pytest_afd.backends.cpu.afd.rank import COMMAND_FORWARD, FAULT_MODES, RankLayout
from pytest_afd.backends.cpu.afd.step_evidence import step_evidence

QUANTIZATION_NONE = "none"
ROUTING_NATURAL = "natural"


@dataclass
class AfdForwardResult:
    """One AFD forward: per-token final hidden rows, the requested logits rows, evidence."""

    hidden: np.ndarray  # [T, hidden] real rows in logical order (before the final norm)
    logits: np.ndarray  # [len(logits_rows) or T, vocab]
    expert_load: list[list[int]]  # per MoE layer, real tokens routed to each expert
    padding_routed_rows: int = 0  # padding rows that went through the experts (all MoE layers)
    evidence: dict[str, Any] = field(default_factory=dict)
    wall_time_s: float = 0.0
    # Instrumented runs: every rank's raw spans by global rank (Attention ranks first).
    spans: dict[int, list[Span]] = field(default_factory=dict)


@dataclass(frozen=True)
class StepOptions:
    """What every rank of one step is told besides its batch."""

    step: int
    instrument: bool
    trace_dir: str | None  # instrumented steps only (docs/profiling.md)
    quantization: str
    routing: str
    stage_dense_layers: bool
    agreement_plans: list[SplitPlan] | None  # debug mode: every Attention rank's plan


def forward_messages(
    batches: Sequence[tuple],
    options: StepOptions,
    *,
    attention_ranks: Sequence[int],
    ffn_ranks: Sequence[int],
    fault: dict | None,
) -> dict[int, Any]:
    """One forward command per rank: Attention rank i gets ``batches[i]``, checked first."""
    messages: dict[int, Any] = {}
    for rank, (input_ids, metadata, plan, logits_rows) in zip(
        attention_ranks, batches, strict=True
    ):
        ids = check_batch(input_ids, metadata, plan)
        rows = None if logits_rows is None else np.asarray(logits_rows, dtype=np.int64)
        messages[rank] = (
            COMMAND_FORWARD,
            {
                "step": options.step,
                "input_ids": ids,
                "metadata": metadata,
                "plan": plan,
                "instrument": options.instrument,
                "trace_dir": options.trace_dir,
                "quantization": options.quantization,
                "routing": options.routing,
                "logits_rows": rows,
                "stage_dense_layers": options.stage_dense_layers,
                "agreement_plans": options.agreement_plans,
            },
        )
    for ffn_index, rank in enumerate(ffn_ranks):
        rank_fault = fault if fault is not None and fault["ffn_rank"] == ffn_index else None
        messages[rank] = (
            COMMAND_FORWARD,
            {
                "step": options.step,
                "instrument": options.instrument,
                "trace_dir": options.trace_dir,
                "quantization": options.quantization,
                "routing": options.routing,
                "fault": rank_fault,
                "agreement_plans": options.agreement_plans,
            },
        )
    return messages


def forward_results(
    replies: Mapping[int, Any],
    batches: Sequence[tuple],
    *,
    topology: RankLayout,
    attention_ranks: Sequence[int],
    ffn_ranks: Sequence[int],
    rank_names: Mapping[int, str],
    num_moe_layers: int,
    instrument: bool,
    agreement_checked: bool,
) -> list[AfdForwardResult]:
    """One result per Attention rank, each carrying the whole step's evidence."""
    spans = {rank: as_spans(rank, replies[rank]["spans"]) for rank in replies}
    starts = [replies[r]["step_start"] for r in attention_ranks]
    ends = [replies[r]["step_end"] for r in attention_ranks]
    evidence = step_evidence(
        topology=topology,
        spans=spans,
        plans=[batch[2] for batch in batches],
        expert_loads=[replies[r]["expert_load"] for r in attention_ranks],
        ffn_routed_rows={r: replies[r]["routed_rows"] for r in ffn_ranks},
        step_time_s=max(ends) - min(starts),
        instrumented=instrument,
        cpu_time_s={r: replies[r]["cpu_time_s"] for r in replies},
        involuntary_switches={r: replies[r]["involuntary_switches"] for r in replies},
    )
    # What each rank agreed on (debug mode), or None: the agreement did not run.
    evidence["agreed_fingerprints"] = {
        rank_names[rank]: replies[rank]["agreed_fingerprints"] for rank in replies
    } if agreement_checked else None
    return [
        AfdForwardResult(
            hidden=replies[rank]["hidden"],
            logits=replies[rank]["logits"],
            expert_load=replies[rank]["expert_load"],
            padding_routed_rows=sum(u.num_padded_tokens for u in plan.ubatches)
            * num_moe_layers,
            evidence=evidence,
            wall_time_s=replies[rank]["step_end"] - replies[rank]["step_start"],
            spans=spans if instrument else {},
        )
        for rank, (_, _, plan, _) in zip(attention_ranks, batches, strict=True)
    ]


def check_batch(input_ids, metadata: BatchMetadata, plan: SplitPlan) -> np.ndarray:
    """Reject a batch whose ids, metadata and plan disagree, before any rank sees it."""
    ids = np.asarray(input_ids, dtype=np.int64)
    if ids.ndim != 1:
        raise ValueError(f"input_ids must be 1-D token ids, got shape {ids.shape}")
    if ids.shape[0] != metadata.num_tokens:
        raise ValueError(
            f"input_ids has {ids.shape[0]} tokens but metadata has {metadata.num_tokens}"
        )
    if plan.num_tokens != metadata.num_tokens:
        raise ValueError(
            f"plan covers {plan.num_tokens} tokens but metadata has {metadata.num_tokens}"
        )
    scheduled = tuple(np.diff(np.asarray(metadata.query_start_loc)).tolist())
    if plan.num_scheduled_tokens != scheduled:
        raise ValueError(
            f"plan's per-request tokens {plan.num_scheduled_tokens} differ from the "
            f"metadata's {scheduled}"
        )
    return ids


def check_fault(fault: dict, num_ffn: int) -> None:
    """Reject an injected fault naming an unknown mode, FFN rank or layer."""
    if fault.get("mode") not in FAULT_MODES:
        raise ValueError(f"fault mode {fault.get('mode')!r}; expected one of {FAULT_MODES}")
    if not 0 <= fault.get("ffn_rank", -1) < num_ffn:
        raise ValueError(f"fault ffn_rank {fault.get('ffn_rank')!r}; expected 0..{num_ffn - 1}")
    if not isinstance(fault.get("layer"), int):
        raise ValueError(f"fault layer {fault.get('layer')!r}; expected a layer index")
