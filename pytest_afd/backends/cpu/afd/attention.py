"""What an Attention rank runs for one forward step.

Embeddings, every layer's attention, the gate (route), the dense layers' MLP, the final
norm and logits, and the paged KV cache. Dense layers run on the whole batch; MoE layers
run as the plan's ubatches, two-stage pipelined: after ubatch u's attention and gate its
rows are dispatched (a2e) without waiting, so the FFN ranks run ubatch 0's experts while
this rank runs ubatch 1's attention; ubatch u's expert output is combined (e2a) just before
its next layer's attention needs it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from afd_split.checks.requests import RequestFields
from afd_split.engine.rows import gather_ubatch_rows, merge_outputs
from afd_split.hook.planning.engine_step import check_engine_step
from pytest_afd.backends.cpu.afd import connector
from pytest_afd.backends.cpu.afd.evidence import (
    ATTENTION,
    COMBINE,
    DENSE_MLP,
    DISPATCH,
    EMBED,
    FINAL,
    ROUTE,
    WAIT,
    Timeline,
)
from pytest_afd.backends.cpu.afd.experts import shard_for_ffn
from pytest_afd.backends.cpu.afd.protocol import RankSpec
from pytest_afd.backends.cpu.afd.rank import (
    COMMAND_COPY_KV,
    COMMAND_FORWARD,
    COMMAND_RESET_KV,
    Role,
    involuntary_switches,
)
from pytest_afd.backends.cpu.afd.tracing import traced
from pytest_afd.backends.cpu.engine_glue import ASCEND_ENGINE_LAYOUT, split_engine_metadata
from pytest_afd.backends.cpu.executor import PAD_TOKEN_ID
from pytest_afd.backends.cpu.kv_cache import PagedKVCache
from pytest_afd.backends.cpu.model import row_positions
from pytest_afd.backends.cpu.pcp import PcpEmulation, pcp_enabled


class AttentionRole(Role):
    """One Attention rank: owns the KV cache and everything but the MoE experts."""

    def __init__(self, spec: RankSpec, **role_kwargs: Any) -> None:
        super().__init__(spec, **role_kwargs)
        self.kv_cache: PagedKVCache | None = None

    def handle(self, message: tuple) -> Any:
        command, body = message
        if command == COMMAND_RESET_KV:
            self.kv_cache = None
            return {}
        if command == COMMAND_COPY_KV:
            with torch.inference_mode():  # the cache's tensors were made in inference mode
                return self.copy_kv(**body)
        if command != COMMAND_FORWARD:
            raise ValueError(f"unknown command {command!r}")
        with torch.inference_mode(), traced(self.spec, body) as trace:
            reply = self.forward(**body)
        return trace.annotate(reply)

    def copy_kv(self, *, block_size: int, src: np.ndarray, dst: np.ndarray) -> dict:
        """Copy KV slots in every layer (a partially reused prefix block, see BlockPool)."""
        if self.kv_cache is None or self.kv_cache.block_size != block_size:
            self.kv_cache = PagedKVCache(self.config, block_size)
        highest = int(max(src.max(initial=0), dst.max(initial=0)))
        self.kv_cache.ensure_blocks(highest // block_size + 1)
        self.kv_cache.copy_slots(torch.from_numpy(src), torch.from_numpy(dst))
        return {}

    def _cache_for(self, metadata) -> PagedKVCache:
        block_size = metadata.block_size
        if self.kv_cache is None or self.kv_cache.block_size != block_size:
            self.kv_cache = PagedKVCache(self.config, block_size)
        table = np.asarray(metadata.block_table)
        if table.size:
            self.kv_cache.ensure_blocks(int(table.max()) + 1)
        return self.kv_cache

    def forward(
        self,
        *,
        step: int,
        input_ids: np.ndarray,
        metadata,
        plan,
        instrument: bool,
        quantization: str,
        routing: str,
        logits_rows: np.ndarray | None,
        stage_dense_layers: bool,
        agreement_plans: list | None = None,
    ) -> dict:
        """One prefill forward; returns final hidden rows, logits rows, load and spans.

        Dense layers run on the whole batch (the CAM recipe's data flow) unless
        ``stage_dense_layers``: then they run per ubatch too, as the in-process
        executor does, which makes a cut inside a request bit-identical to it.
        """
        agreed = self.agree(agreement_plans)
        model = self.models.get(quantization, routing)
        timeline = Timeline(instrument)
        kv_cache = self._cache_for(metadata)
        layers = model.layers
        expert_load = []
        step_start = time.perf_counter()
        cpu_start = time.process_time()
        switches_start = involuntary_switches()
        ids = torch.from_numpy(np.asarray(input_ids, dtype=np.int64))
        first_moe = next((layer.index for layer in layers if layer.is_moe), len(layers))
        if any(not layer.is_moe for layer in layers[first_moe:]):
            raise ValueError("the AFD runtime stages MoE layers only after all dense layers")
        pcp = PcpEmulation(plan, metadata) if pcp_enabled(plan) else None

        def stage_rows_of(rows, pad_value=0):
            # Under PCP every rank's rows move to each stage's own zigzag (the hook's relayout).
            if pcp is not None:
                return pcp.stage_inputs(rows, pad_value)
            return [gather_ubatch_rows(plan, u, rows, pad_value=pad_value)
                    for u in range(len(plan.ubatches))]

        if stage_dense_layers:
            # Padding rows embed the executor's pad token: padding routes to experts
            # too, and the expert GEMM shapes must match for bit-identical rows.
            with timeline.span(EMBED):
                states = [model.embed(rows) for rows in stage_rows_of(ids, PAD_TOKEN_ID)]
            hidden, expert_load = self._staged_layers(
                layers, states, metadata, plan, kv_cache, timeline, step, pcp
            )
        else:
            with timeline.span(EMBED):
                hidden = model.embed(ids)
            for layer in layers[:first_moe]:
                with timeline.span(ATTENTION, layer.index):
                    hidden = layer.attention(hidden, metadata, kv_cache)
                with timeline.span(DENSE_MLP, layer.index):
                    hidden = hidden + layer.mlp(layer.ffn_input(hidden))
            states = stage_rows_of(hidden)
            hidden, expert_load = self._staged_layers(
                layers[first_moe:], states, metadata, plan, kv_cache, timeline, step, pcp
            )
        for ffn_index in range(self.topology.num_ffn):
            connector.send_end(
                self.topology.ffn_global_rank(ffn_index),
                self.topology.ffn_name(ffn_index),
                step,
                self.peer_timeout_s,
            )
        with timeline.span(FINAL):
            if logits_rows is None:  # each request's last scheduled token, as the executor
                logits_rows = np.asarray(metadata.query_start_loc[1:]) - 1
            logits = model.final(hidden[torch.from_numpy(np.asarray(logits_rows, dtype=np.int64))])
        step_end = time.perf_counter()
        return {
            "cpu_time_s": time.process_time() - cpu_start,
            "involuntary_switches": involuntary_switches() - switches_start,
            "hidden": hidden.numpy(),
            "logits": logits.numpy(),
            "expert_load": expert_load,
            "spans": timeline.spans,
            "step_start": step_start,
            "step_end": step_end,
            "agreed_fingerprints": agreed,
        }

    def _staged_layers(self, staged_layers, states, metadata, plan, kv_cache, timeline, step,
                       pcp=None):
        """Layers run per ubatch; returns merged real rows and per-MoE-layer expert load."""
        topology = self.topology
        num_ubatches = len(plan.ubatches)
        # The engine glue: Ascend-layout metadata through the hook's seam and checks (under
        # PCP the hook's PCP glue on every emulated rank).
        ubatch_metadata = split_engine_metadata(plan, metadata, layout_name=ASCEND_ENGINE_LAYOUT,
                                                pcp_emulation=pcp)
        # The request-level check on exactly the ubatches this rank runs (what the gates'
        # split observer checks in-process, out of its reach here).
        check_engine_step(plan, RequestFields.of(metadata),
                          [RequestFields.of(part) for part in ubatch_metadata])
        real_rows = [plan.ubatches[u].real_row_indices for u in range(num_ubatches)]
        positions = [
            row_positions(
                ubatch_metadata[u], torch.from_numpy(real_rows[u].copy()), states[u].shape[0]
            )
            for u in range(num_ubatches)
        ]
        pending: list[list[connector.PendingResult]] = [[] for _ in range(num_ubatches)]
        expert_load = []
        for layer in staged_layers:
            layer_load = torch.zeros(self.config.n_routed_experts, dtype=torch.int64)
            for u in range(num_ubatches):
                states[u] = self._combine(states[u], pending[u], timeline)
                with timeline.span(ATTENTION, layer.index, u):
                    states[u] = layer.attention(
                        states[u], ubatch_metadata[u], kv_cache, real_rows=real_rows[u]
                    )
                if not layer.is_moe:
                    with timeline.span(DENSE_MLP, layer.index, u):
                        states[u] = states[u] + layer.mlp(layer.ffn_input(states[u]))
                    pending[u] = []
                    continue
                with timeline.span(ROUTE, layer.index, u):
                    normed = layer.ffn_input(states[u])
                    topk_ids, topk_weights = layer.route(normed, positions[u])
                real_ids = topk_ids[torch.from_numpy(real_rows[u].copy())]
                layer_load += torch.bincount(real_ids.reshape(-1), minlength=layer_load.numel())
                pending[u] = []
                for ffn_index in range(topology.num_ffn):
                    peer = topology.ffn_global_rank(ffn_index)
                    with timeline.span(DISPATCH, layer.index, u, peer):
                        rows, ids, weights, flags = shard_for_ffn(
                            topk_ids, topk_weights, topology, ffn_index
                        )
                        payload = connector.A2EPayload(
                            layer.index,
                            u,
                            step,
                            normed[rows] if topology.num_ffn > 1 else normed,
                            ids,
                            weights,
                            flags,
                        )
                        pending[u].append(
                            connector.dispatch(
                                peer,
                                topology.ffn_name(ffn_index),
                                payload,
                                rows if topology.num_ffn > 1 else None,
                            )
                        )
            if layer.is_moe:
                expert_load.append(layer_load.tolist())
        for u in range(num_ubatches):
            states[u] = self._combine(states[u], pending[u], timeline)
        if pcp is not None:  # back through every rank's rows, as the engine restores them
            return pcp.merged(states), expert_load
        return merge_outputs(plan, states), expert_load

    def _combine(self, state, pending, timeline) -> torch.Tensor:
        """Wait for a ubatch's expert outputs (the exposed bubble) and add them in."""
        if not pending:
            return state
        results = []
        for item in pending:
            with timeline.span(WAIT, item.layer, item.ubatch, item.peer):
                results.append(item.wait(self.peer_timeout_s))
        with timeline.span(COMBINE, pending[0].layer, pending[0].ubatch):
            if pending[0].rows is None:
                return state + results[0]
            moe = torch.zeros_like(state)
            for item, result in zip(pending, results, strict=True):
                moe.index_add_(0, item.rows, result)
            return state + moe
