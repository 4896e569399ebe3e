"""Runs one forward of the CPU model over ``afd_split`` metadata: unsplit or as a SplitPlan.

A split runs through the engine glue (``engine_glue.split_engine_metadata``:
vLLM-layout metadata, the vLLM adapter, the per-step checks on what it
produced). Split order per layer is the one AFD's async MoE stages use: attention of
ubatch 0, attention of ubatch 1 (so the head's KV of a request cut in two is in
the cache before the tail reads it), then the FFN of each ubatch. Padding rows
(``UBatch.num_padded_tokens``) run through every token-wise piece, are never
written to the KV cache and are dropped by ``afd_split.engine.rows.merge_outputs``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from afd_split import SplitPlan
from afd_split.checks.metadata import BatchMetadata
from afd_split.engine.rows import gather_ubatch_rows, merge_outputs
from pytest_afd.backends.cpu.attention_geometry import AttentionGeometry
from pytest_afd.backends.cpu.engine_glue import VLLM_ENGINE_LAYOUT, split_engine_metadata
from pytest_afd.backends.cpu.kv_cache import PagedKVCache
from pytest_afd.backends.cpu.model import DeepseekV32Model, row_positions
from pytest_afd.backends.cpu.pcp import PcpEmulation, pcp_enabled

# Token id of padding rows (any valid id: their outputs are dropped).
PAD_TOKEN_ID = 0
# Component names of instrumented timings (the AFD runtime's span kinds).
ATTENTION = "attention"
ROUTE = "route"
ROUTED_MOE = "routed_moe"
SHARED_MOE = "shared_moe"
DENSE_MLP = "dense_mlp"


class LayerTimer:
    """Per-layer, per-ubatch seconds of each component; disabled timers cost one branch."""

    def __init__(self, enabled: bool, num_layers: int, num_ubatches: int) -> None:
        self.enabled = enabled
        self.seconds = [[{} for _ in range(num_ubatches)] for _ in range(num_layers)] if enabled else []

    @contextlib.contextmanager
    def span(self, component: str, layer: int, ubatch: int) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        started = time.perf_counter()
        yield
        slot = self.seconds[layer][ubatch]
        slot[component] = slot.get(component, 0.0) + time.perf_counter() - started


@dataclass
class ExecOutput:
    """Outputs of one forward; request-indexed arrays follow the batch's request order."""

    # [R, vocab] float32 logits of each request's last scheduled token.
    last_logits: torch.Tensor
    # [R] greedy next token (argmax of last_logits).
    next_tokens: torch.Tensor
    # [num MoE layers, n_routed_experts] routed real tokens per expert (padding excluded).
    expert_load: np.ndarray
    # Routed rows of padding per MoE layer (padding costs expert work too).
    padding_routed_rows: int = 0
    # Per layer [T, hidden] real-token hidden states after the layer (when requested).
    layer_hidden: list[torch.Tensor] | None = None
    ubatch_rows: list[int] = field(default_factory=list)
    # Instrumented forwards: [layer][ubatch] {component: seconds}.
    layer_seconds: list[list[dict[str, float]]] = field(default_factory=list)


@dataclass
class _Stage:
    """One ubatch's rows while a forward runs."""

    metadata: BatchMetadata
    real_rows: np.ndarray | None
    hidden: torch.Tensor
    positions: torch.Tensor
    real_mask: torch.Tensor
    dense_metadata: BatchMetadata | None = None
    """Under PCP, the dense layers' metadata: the full batch's slots (``PcpEmulation``)."""

    geometries: dict = field(default_factory=dict)
    """``AttentionGeometry`` per metadata object (id), made by the first layer, read by all."""

    def attention_metadata(self, layer) -> BatchMetadata:
        """The dense layers run on the full batch's metadata, the MoE layers on the stage's."""
        if self.dense_metadata is None or layer.is_moe:
            return self.metadata
        return self.dense_metadata

    def attention_geometry(self, config, metadata: BatchMetadata) -> AttentionGeometry:
        """What every layer's attention derives from ``metadata`` alone, made once per forward."""
        geometry = self.geometries.get(id(metadata))
        if geometry is None:
            # Under PCP the dense layers' metadata differs from the stage's in its slots alone.
            geometry = next((made for other in self.geometries.values()
                             if (made := other.with_slots_of(metadata)) is not None), None)
            if geometry is None:
                geometry = AttentionGeometry.of(config, metadata, self.real_rows,
                                                self.hidden.shape[0])
            self.geometries[id(metadata)] = geometry
        return geometry


class Executor:
    """Executes forwards of ``model`` against ``kv_cache`` (blocks are allocated by the caller)."""

    def __init__(self, model: DeepseekV32Model, kv_cache: PagedKVCache,
                 split_observers: tuple = ()) -> None:
        if kv_cache.config.num_hidden_layers != model.config.num_hidden_layers:
            raise ValueError(
                f"kv cache has {kv_cache.config.num_hidden_layers} layers, model has "
                f"{model.config.num_hidden_layers}"
            )
        self.model = model
        self.kv_cache = kv_cache
        # ``pytest_afd.core.backend.SplitObserver``s shown every split this executor runs.
        self.split_observers = tuple(split_observers)

    @torch.inference_mode()
    def execute(self, input_ids, metadata: BatchMetadata, plan: SplitPlan | None = None, *,
                return_hidden_states: bool = False, instrument: bool = False) -> ExecOutput:
        """One forward over the batch's real tokens ``input_ids`` [T]."""
        ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.int64)
        if ids.ndim != 1 or len(ids) != metadata.num_tokens:
            raise ValueError(
                f"input_ids has shape {tuple(ids.shape)}; metadata has {metadata.num_tokens} tokens"
            )
        if metadata.block_size != self.kv_cache.block_size:
            raise ValueError(
                f"metadata block_size={metadata.block_size} but the KV cache uses "
                f"{self.kv_cache.block_size}"
            )
        pcp = PcpEmulation(plan, metadata) if pcp_enabled(plan) else None
        stages = self._stages(ids, metadata, plan, pcp)
        config = self.model.config
        load = np.zeros((len(config.moe_layer_indices), config.n_routed_experts), dtype=np.int64)
        padding_routed = 0
        layer_hidden = [] if return_hidden_states else None
        timer = LayerTimer(instrument, config.num_hidden_layers, len(stages))
        for layer in self.model.layers:
            for ubatch, stage in enumerate(stages):
                with timer.span(ATTENTION, layer.index, ubatch):
                    metadata_of_layer = stage.attention_metadata(layer)
                    stage.hidden = layer.attention(
                        stage.hidden, metadata_of_layer, self.kv_cache, real_rows=stage.real_rows,
                        geometry=stage.attention_geometry(config, metadata_of_layer))
            for ubatch, stage in enumerate(stages):
                topk_ids = self._ffn(layer, stage, timer, ubatch)
                if topk_ids is not None:
                    moe_index = layer.index - config.first_k_dense_replace
                    real_ids = topk_ids[stage.real_mask].reshape(-1)
                    load[moe_index] += np.bincount(real_ids.numpy(), minlength=config.n_routed_experts)
                    padding_routed += int((~stage.real_mask).sum())
            if layer_hidden is not None:
                layer_hidden.append(self._merge(plan, stages, pcp))
        hidden = self._merge(plan, stages, pcp)
        last_rows = torch.from_numpy(np.asarray(metadata.query_start_loc[1:]) - 1)
        logits = self.model.final(hidden[last_rows])
        return ExecOutput(
            last_logits=logits,
            next_tokens=logits.argmax(-1),
            expert_load=load,
            padding_routed_rows=padding_routed,
            layer_hidden=layer_hidden,
            ubatch_rows=[stage.hidden.shape[0] for stage in stages],
            layer_seconds=timer.seconds,
        )

    @staticmethod
    def _ffn(layer, stage: _Stage, timer: LayerTimer, ubatch: int) -> torch.Tensor | None:
        """The layer's FFN half on one ubatch (same maths as ``DecoderLayer.ffn``)."""
        if not layer.is_moe:
            with timer.span(DENSE_MLP, layer.index, ubatch):
                stage.hidden = stage.hidden + layer.mlp(layer.ffn_input(stage.hidden))
            return None
        with timer.span(ROUTE, layer.index, ubatch):
            normed = layer.ffn_input(stage.hidden)
            topk_ids, topk_weights = layer.route(normed, stage.positions)
        with timer.span(ROUTED_MOE, layer.index, ubatch):
            routed = layer.experts(normed, topk_ids, topk_weights)
        with timer.span(SHARED_MOE, layer.index, ubatch):
            shared = layer.shared_experts(normed)
        stage.hidden = stage.hidden + (routed + shared)
        return topk_ids

    def _stages(self, ids: torch.Tensor, metadata: BatchMetadata, plan: SplitPlan | None,
                pcp: PcpEmulation | None) -> list[_Stage]:
        if plan is None:
            rows = torch.arange(len(ids))
            return [_Stage(metadata, None, self.model.embed(ids),
                           row_positions(metadata, rows, len(ids)),
                           torch.ones(len(ids), dtype=torch.bool))]
        if plan.num_tokens != metadata.num_tokens:
            raise ValueError(
                f"plan covers {plan.num_tokens} tokens; metadata has {metadata.num_tokens}"
            )
        for observer in self.split_observers:
            observer.before_split(plan, metadata)
        # The engine glue: vLLM-layout metadata through the vLLM adapter and the hook's checks.
        # Under PCP the hook's PCP glue on every emulated rank (pcp.PcpEmulation).
        parts = split_engine_metadata(plan, metadata, layout_name=VLLM_ENGINE_LAYOUT,
                                      pcp_emulation=pcp)
        for observer in self.split_observers:
            observer.after_split(plan, metadata, parts)
        pcp_ids = None if pcp is None else pcp.stage_inputs(ids, PAD_TOKEN_ID)
        stages = []
        for index, (ubatch, part) in enumerate(zip(plan.ubatches, parts, strict=True)):
            ub_ids = (gather_ubatch_rows(plan, index, ids, pad_value=PAD_TOKEN_ID)
                      if pcp_ids is None else pcp_ids[index])
            real_rows = np.asarray(ubatch.real_row_indices)
            rows = torch.from_numpy(real_rows.astype(np.int64))
            real_mask = torch.zeros(ubatch.num_rows, dtype=torch.bool)
            real_mask[rows] = True
            stages.append(_Stage(part, real_rows, self.model.embed(ub_ids),
                                 row_positions(part, rows, ubatch.num_rows), real_mask,
                                 None if pcp is None else pcp.dense_kernels[index]))
        return stages

    @staticmethod
    def _merge(plan: SplitPlan | None, stages: list[_Stage],
               pcp: PcpEmulation | None) -> torch.Tensor:
        if plan is None:
            return stages[0].hidden
        if pcp is not None:  # back through every rank's rows, as the engine restores them
            return pcp.merged([stage.hidden for stage in stages])
        return merge_outputs(plan, [stage.hidden for stage in stages])
