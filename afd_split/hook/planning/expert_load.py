"""Per-stage, per-layer, per-expert routed-token counts of an AFD Attention rank.

Where the counts come from (afd-plugin main 2e4378f and release/v0.19.1rc1
2f4f462): every MoE layer's router runs on the Attention side
(``deepseek_v2_attention_gate.compute_gate_topk``, which also applies the
``AFD_FORCE_BALANCED_TOPK_IDS`` forced balancing in place), and each stage's
``[tokens, top_k]`` ids reach ``CAMAsyncAFDConnector.send_attn_output``
together with the stage and layer (``context.metadata``) right before the CAM
dispatch. The hook's dispatch seam hands them to ``ExpertLoadRecorder``.

Counting stays on the device: one ``index_add_`` into a preallocated
``[stages, layers, experts]`` tensor per dispatch, no host read. Only real rows
count: the pipeline slices ``hidden_states[token_slice]``, so a stage's padding
rows (the SP parent's padding on the tail; under PCP the stage layouts' own pad
rows) reach the dispatch with router ids too. The planner hands each stage's
``StageRows`` (which of its rows on this rank hold a real token, from the plan
and the relayout) to ``begin_step``; every id is weighted 1 (real row) or 0, and
the padding rows (and, on PCP ranks other than 0, the decode copies every rank
holds) are reported apart, as host counts, like the CPU backend's
``padding_routed_rows``. Once per step
the counts come to the host in one copy: at the step's last dispatch (the last
layer of its last stage) or, when that never came, when the next step is
planned. The line (``EXPERT_LOAD_KIND``) carries the step number of the step
line it belongs to, so a reader joins them per rank file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from afd_split.hook.planning.worker_evidence import EVIDENCE_FORMAT

EXPERT_LOAD_KIND = "afd_expert_load"
"""``kind`` of an expert-load line (one per step with MoE dispatches)."""

FLUSHED_AT_LAST_DISPATCH = "last_dispatch"
FLUSHED_AT_NEXT_STEP = "next_step"

NATURAL = "natural"
FORCED_BALANCED = "forced_balanced"

MAX_STAGES = 2
"""Stages of one step (the plugin's async-MoE ubatching supports two)."""


@dataclass(frozen=True)
class StageRows:
    """One stage's rows on this rank as the pipeline dispatches them: ``real[i]`` when row
    ``i`` holds a token counted here; ``padding`` pad rows and ``replicated`` decode copies
    (held on every PCP rank, counted on rank 0 only) are the other rows."""

    real: Any
    padding: int = 0
    replicated: int = 0

    @property
    def num_rows(self) -> int:
        return len(self.real)

    @classmethod
    def leading(cls, num_real: int, num_rows: int) -> StageRows:
        """Real rows first, then padding (a stage sliced from the SP-padded parent)."""
        import numpy as np

        return cls(np.arange(num_rows) < num_real, padding=num_rows - num_real)


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
    stage_rows: tuple[StageRows, ...] | None = None
    row_weights: dict = field(default_factory=dict)
    padding_routed_rows: int = 0
    replicated_routed_rows: int = 0

    def begin_step(self, step: int, num_stages: int,
                   stage_rows: tuple[StageRows, ...] | None = None) -> None:
        """A new step was planned: flush a step whose last dispatch never came, then count
        this one's ``num_stages`` stages (real rows only when ``stage_rows`` is given)."""
        if self.pending:
            self.flush(FLUSHED_AT_NEXT_STEP)
        if not 1 <= num_stages <= MAX_STAGES:
            raise ValueError(f"num_stages={num_stages}; the AFD plugin runs 1 to {MAX_STAGES}")
        if stage_rows is not None and len(stage_rows) != num_stages:
            raise ValueError(f"{len(stage_rows)} stage row maps for {num_stages} stages")
        self.step, self.num_stages, self.planned_at = step, num_stages, self.clock()
        self.stage_rows = None if stage_rows is None else tuple(stage_rows)
        self.row_weights.clear()

    def _weights(self, stage_idx: int, topk_ids):
        """Per id, 1 when its row is real (device tensor, made once per stage and step);
        None: count every row (no row map) or the dispatch does not match the map."""
        if self.stage_rows is None:
            return None
        rows = self.stage_rows[stage_idx]
        if rows.num_rows != topk_ids.shape[0]:
            return False
        weights = self.row_weights.get(stage_idx)
        if weights is None:
            torch = torch_module()
            real = torch.as_tensor(rows.real, dtype=torch.int64).to(topk_ids.device)
            weights = real[:, None].expand(rows.num_rows, topk_ids.shape[1]).reshape(-1)
            self.row_weights[stage_idx] = weights
        return weights

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
        weights = self._weights(stage_idx, topk_ids)
        if weights is False:  # rows other than the planned stage's: not counted, reported
            self.unplanned_dispatches += 1
            return
        if self.counts is None:
            self.counts = topk_ids.new_zeros((MAX_STAGES, self.num_layers, num_experts),
                                             dtype=torch_module().int64)
            self.one = self.counts.new_ones(1)  # expanded per dispatch: no allocation
        self.expert_per_rank = expert_per_rank
        flat = topk_ids.reshape(-1)
        if weights is None:
            weights = self.one.expand(flat.shape[0])
        else:
            rows = self.stage_rows[stage_idx]
            self.padding_routed_rows += rows.padding
            self.replicated_routed_rows += rows.replicated
        self.counts[stage_idx, layer_idx].index_add_(0, flat, weights)
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
            "real_rows_only": self.stage_rows is not None,
            "padding_routed_rows": self.padding_routed_rows,
            "replicated_routed_rows": self.replicated_routed_rows,
        }
        self.layers_seen.clear()
        self.pending, self.step, self.unplanned_dispatches = False, None, 0
        self.padding_routed_rows = self.replicated_routed_rows = 0
        self.write(record)
        return record


def routing_label(*, force_balanced_env: bool, force_load_balance_config: bool,
                  gate_on_attention: bool = True) -> str:
    """FORCED_BALANCED when the switch of the dispatched path rewrites the routed ids.

    afd-plugin main 2e4378f / release/v0.19.1rc1 2f4f462: with the gate on Attention
    (the async-MoE path; the ids the dispatch seam counts) the router runs in
    ``deepseek_v2_attention_gate.compute_gate_topk``, which applies only
    ``AFD_FORCE_BALANCED_TOPK_IDS``; ``enable_force_load_balance`` is applied in the
    W8A8 FusedMoE method's own expert selection (``compat/patches/npu/force_load_balance.py``),
    which that path does not run. Without the gate on Attention the reverse holds.
    """
    forced = force_balanced_env if gate_on_attention else force_load_balance_config
    return FORCED_BALANCED if forced else NATURAL
