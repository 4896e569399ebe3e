"""Per-stage, per-layer, per-expert routed-token counts of an AFD Attention rank.

Where the counts come from (afd-plugin main 2e4378f and release/v0.19.1rc1
2f4f462): every MoE layer's router runs on the Attention side
(``deepseek_v2_attention_gate.compute_gate_topk``, which also applies the
``AFD_FORCE_BALANCED_TOPK_IDS`` forced balancing in place), and each stage's
``[tokens, top_k]`` ids reach ``CAMAsyncAFDConnector.send_attn_output``
together with the stage and layer (``context.metadata``) right before the CAM
dispatch. The hook's dispatch seam hands them to ``ExpertLoadRecorder``.

Counting stays on the device: one ``index_add_`` into a preallocated
``[stages, layers, experts]`` tensor per dispatch, no host read. Once per step
the counts come to the host in one copy: at the step's last dispatch (the last
layer of its last stage) or, when that never came, when the next step is
planned. The line (``EXPERT_LOAD_KIND``) carries the step number of the step
line it belongs to, so a reader joins them per rank file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from afd_split.integrations.worker_evidence import EVIDENCE_FORMAT

EXPERT_LOAD_KIND = "afd_expert_load"
"""``kind`` of an expert-load line (one per step with MoE dispatches)."""

FLUSHED_AT_LAST_DISPATCH = "last_dispatch"
FLUSHED_AT_NEXT_STEP = "next_step"

NATURAL = "natural"
FORCED_BALANCED = "forced_balanced"

MAX_STAGES = 2
"""Stages of one step (the plugin's async-MoE ubatching supports two)."""


def torch_module():
    import torch  # lazy: afd_split does not import torch at import time

    return torch


@dataclass
class ExpertLoadRecorder:
    """One Attention rank's routed counts, counted on the device, flushed once per step.

    ``write(record)`` appends a line (the session's evidence writer); ``ranks`` is
    the rank's ``StepRanks.to_dict()``. ``routing`` is ``NATURAL`` or
    ``FORCED_BALANCED`` (a forced run's counts are synthetic).
    """

    num_layers: int
    routing: str
    ranks: dict[str, Any]
    write: Any
    clock: Any = time.perf_counter
    counts: Any = None
    one: Any = None
    step: int | None = None
    num_stages: int = 1
    planned_at: float = 0.0
    layers_seen: set[int] = field(default_factory=set)
    pending: bool = False
    unplanned_dispatches: int = 0
    expert_per_rank: int | None = None

    def begin_step(self, step: int, num_stages: int) -> None:
        """A new step was planned: flush a step whose last dispatch never came, then count
        this one's ``num_stages`` stages."""
        if self.pending:
            self.flush(FLUSHED_AT_NEXT_STEP)
        if not 1 <= num_stages <= MAX_STAGES:
            raise ValueError(f"num_stages={num_stages}; the AFD plugin runs 1 to {MAX_STAGES}")
        self.step, self.num_stages, self.planned_at = step, num_stages, self.clock()

    def dispatched(self, layer_idx: int, stage_idx: int, topk_ids, *, num_experts: int,
                   expert_per_rank: int) -> None:
        """Count one stage's routed ids of one layer (device ops only); flush after the
        step's last dispatch."""
        # A forward the hook did not plan (a dummy run), or a dispatch outside the planned
        # stages and the model's layers: not counted, but reported in the step's line
        # (evidence never fails the forward).
        if (self.step is None or not 0 <= stage_idx < self.num_stages
                or not 0 <= layer_idx < self.num_layers):
            self.unplanned_dispatches += 1
            return
        if self.counts is None:
            self.counts = topk_ids.new_zeros((MAX_STAGES, self.num_layers, num_experts),
                                             dtype=torch_module().int64)
            self.one = self.counts.new_ones(1)  # expanded per dispatch: no allocation
        self.expert_per_rank = expert_per_rank
        flat = topk_ids.reshape(-1)
        self.counts[stage_idx, layer_idx].index_add_(0, flat, self.one.expand(flat.shape[0]))
        self.layers_seen.add(layer_idx)
        self.pending = True
        if layer_idx == self.num_layers - 1 and stage_idx == self.num_stages - 1:
            self.flush(FLUSHED_AT_LAST_DISPATCH)

    def flush(self, flushed_at: str) -> dict | None:
        """Write the step's line (one host copy) and clear the device counts."""
        if not self.pending:
            return None
        layers = sorted(self.layers_seen)
        host = self.counts.to("cpu", copy=True)  # the step's one device-to-host copy
        self.counts.zero_()
        record = {
            "kind": EXPERT_LOAD_KIND,
            "format": EVIDENCE_FORMAT,
            "step": self.step,
            "ranks": self.ranks,
            "routing": self.routing,
            "layers": layers,
            "expert_per_rank": self.expert_per_rank,
            "per_stage": host[: self.num_stages][:, layers].tolist(),
            "flushed_at": flushed_at,
            "plan_to_flush_s": self.clock() - self.planned_at,
            "unplanned_dispatches": self.unplanned_dispatches,
        }
        self.layers_seen.clear()
        self.pending, self.step, self.unplanned_dispatches = False, None, 0
        self.write(record)
        return record


def routing_label(*, force_balanced_env: bool, force_load_balance_config: bool) -> str:
    """FORCED_BALANCED when either upstream switch rewrites the routed ids."""
    return FORCED_BALANCED if force_balanced_env or force_load_balance_config else NATURAL
