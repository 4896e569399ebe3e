"""What the Attention and FFN processes run for one forward step.

Attention rank: embeddings, every layer's attention, the gate (route), the dense
layers' MLP, the final norm and logits, and the paged KV cache. Dense layers run
on the whole batch; MoE layers run as the plan's ubatches, two-stage pipelined:
after ubatch u's attention and gate its rows are dispatched (a2e) without
waiting, so the FFN ranks run ubatch 0's experts while this rank runs ubatch 1's
attention; ubatch u's expert output is combined (e2a) just before its next
layer's attention needs it.

FFN rank: the routed experts it owns and its share of the shared experts,
serving (layer, ubatch) messages in arrival order until every Attention rank
said the step ended.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from afd_split import SplitMismatchError, gather_ubatch_rows, merge_outputs
from afd_split.checks.requests import RequestFields
from afd_split.hook.planning.engine_step import check_engine_step
from afd_split.plan.agree import agree_on_split
from pytest_afd.backends.cpu.afd import connector
from pytest_afd.backends.cpu.afd.evidence import (
    ATTENTION,
    COMBINE,
    DENSE_MLP,
    DISPATCH,
    EMBED,
    FFN_IDLE,
    FINAL,
    RECV,
    ROUTE,
    ROUTED_MOE,
    SEND,
    SHARED_MOE,
    WAIT,
    Timeline,
)
from pytest_afd.backends.cpu.afd.procs import RankSpec
from pytest_afd.backends.cpu.afd.tracing import traced
from pytest_afd.backends.cpu.config import ModelConfig
from pytest_afd.backends.cpu.engine_glue import ASCEND_ENGINE_LAYOUT, split_engine_metadata
from pytest_afd.backends.cpu.executor import PAD_TOKEN_ID
from pytest_afd.backends.cpu.kv_cache import PagedKVCache
from pytest_afd.backends.cpu.model import DeepseekV32Model, build_model, row_positions
from pytest_afd.backends.cpu.pcp import PcpEmulation, pcp_enabled
from pytest_afd.backends.cpu.weights import load_pretrained

COMMAND_FORWARD = "forward"
COMMAND_RESET_KV = "reset_kv"
COMMAND_COPY_KV = "copy_kv"

FAULT_KILL = "kill"  # SIGKILL itself: a crashed rank
FAULT_HANG = "hang"  # stop answering: a hung rank
FAULT_RAISE = "raise"  # raise inside the step: a failing rank
FAULT_MODES = (FAULT_KILL, FAULT_HANG, FAULT_RAISE)
HANG_SLEEP_S = 3600.0


@dataclass(frozen=True)
class Topology:
    """Rank layout shared by every process: Attention ranks first, then FFN ranks."""

    num_attention: int
    num_ffn: int
    num_experts: int

    def ffn_global_rank(self, ffn_index: int) -> int:
        return self.num_attention + ffn_index

    def ffn_name(self, ffn_index: int) -> str:
        return f"FFN rank {ffn_index}"

    def attention_name(self, attention_index: int) -> str:
        return f"Attention rank {attention_index}"

    def expert_ranges(self) -> list[tuple[int, int]]:
        """Contiguous expert-parallel shards: FFN rank f owns experts [lo, hi)."""
        bounds = np.linspace(0, self.num_experts, self.num_ffn + 1).round().astype(int)
        return [(int(bounds[f]), int(bounds[f + 1])) for f in range(self.num_ffn)]

    def expert_owner(self) -> np.ndarray:
        """FFN rank index of every expert."""
        owner = np.zeros(self.num_experts, dtype=np.int64)
        for ffn_index, (low, high) in enumerate(self.expert_ranges()):
            owner[low:high] = ffn_index
        return owner


class _ModelVariants:
    """Builds the model once per process and keeps one variant per (quant, routing).

    Weights are seeded (``build_model``) or, with ``model_dir``, loaded from a
    Hugging Face-style directory, so every rank holds the same weights.
    """

    def __init__(self, config: ModelConfig, seed: int, model_dir: str | None = None) -> None:
        if model_dir is None:
            self._base = build_model(config, seed)
        else:
            loaded_config, weights = load_pretrained(model_dir, name=config.name)
            if loaded_config != config:
                raise ValueError(f"{model_dir!r} holds {loaded_config}, expected {config}")
            self._base = DeepseekV32Model(config, weights)
        self._variants: dict[tuple[str, str], DeepseekV32Model] = {}

    def get(self, quantization: str, routing: str) -> DeepseekV32Model:
        key = (quantization, routing)
        if key not in self._variants:
            self._variants[key] = self._base.variant(quantization=quantization, routing=routing)
        return self._variants[key]


def shard_for_ffn(
    topk_ids: torch.Tensor, topk_weights: torch.Tensor, topology: Topology, ffn_index: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows, ids, weights and flags of one ubatch that FFN rank ``ffn_index`` must see.

    One FFN rank takes every row whole. With expert parallelism a rank gets the
    rows with at least one of its experts (each row once, DeepEP-style) plus its
    contiguous chunk of rows for the shared experts; ids of other ranks' experts
    are replaced by one of the row's local experts with weight 0 so the tensor
    stays rectangular and adds exactly nothing.
    """
    num_rows = topk_ids.shape[0]
    if topology.num_ffn == 1:
        flags = torch.full((num_rows,), connector.FLAG_BOTH, dtype=torch.int64)
        return torch.arange(num_rows), topk_ids, topk_weights, flags
    low, high = topology.expert_ranges()[ffn_index]
    local = (topk_ids >= low) & (topk_ids < high)
    routed = local.any(dim=1)
    chunk = torch.tensor_split(torch.arange(num_rows), topology.num_ffn)[ffn_index]
    shared = torch.zeros(num_rows, dtype=torch.bool)
    shared[chunk] = True
    rows = torch.nonzero(routed | shared).squeeze(1)
    first_local = torch.where(local, topk_ids, torch.full_like(topk_ids, low))
    first_local = first_local.gather(1, local.int().argmax(dim=1, keepdim=True))
    ids = torch.where(local, topk_ids, first_local)[rows]
    weights = torch.where(local, topk_weights, torch.zeros_like(topk_weights))[rows]
    flags = (
        routed[rows].long() * connector.FLAG_ROUTED + shared[rows].long() * connector.FLAG_SHARED
    )
    return rows, ids, weights, flags


class _Role:
    """What every rank holds: its spec, the model config and weights, the topology."""

    def __init__(
        self,
        spec: RankSpec,
        *,
        config: ModelConfig,
        seed: int,
        topology: Topology,
        peer_timeout_s: float,
        model_dir: str | None = None,
    ) -> None:
        self.spec = spec
        self.config = config
        self.topology = topology
        self.peer_timeout_s = peer_timeout_s
        self.models = _ModelVariants(config, seed, model_dir)

    def agree(self, plans: list | None) -> list[str] | None:
        """The step's fingerprint agreement, bounded by the peer timeout like every other
        wait on a peer (a frozen rank would otherwise hold the all-gather for the whole
        step timeout); a timeout blames every other rank, since any of them may be stuck."""
        topology = self.topology
        names = [topology.attention_name(index) for index in range(topology.num_attention)]
        names += [topology.ffn_name(index) for index in range(topology.num_ffn)]
        return agree_on_plans(plans, self.peer_timeout_s,
                              [name for name in names if name != self.spec.name])


class AttentionRole(_Role):
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
        with torch.inference_mode(), traced(self.spec, body):
            return self.forward(**body)

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


class FfnRole(_Role):
    """One FFN rank: its expert shard and its share of the shared experts."""

    def handle(self, message: tuple) -> Any:
        command, body = message
        if command in (COMMAND_RESET_KV, COMMAND_COPY_KV):  # the KV cache lives on Attention ranks
            return {}
        if command != COMMAND_FORWARD:
            raise ValueError(f"unknown command {command!r}")
        with torch.inference_mode(), traced(self.spec, body):
            return self.serve(**body)

    def serve(
        self,
        *,
        step: int,
        instrument: bool,
        quantization: str,
        routing: str,
        fault: dict | None = None,
        agreement_plans: list | None = None,
    ) -> dict:
        """Serve a2e messages until every Attention rank sent its end marker."""
        agreed = self.agree(agreement_plans)
        model = self.models.get(quantization, routing)
        timeline = Timeline(instrument)
        cpu_start = time.process_time()
        switches_start = involuntary_switches()
        # Attention ranks still to end this step: a header timeout blames them.
        running = {rank: self.topology.attention_name(rank)
                   for rank in range(self.topology.num_attention)}
        served = 0
        sends = []
        routed_rows = 0
        while running:
            idle_start = time.perf_counter()
            incoming = connector.receive_header(self.peer_timeout_s, list(running.values()))
            source_name = self.topology.attention_name(incoming.source)
            if incoming.step != step:
                raise RuntimeError(
                    f"{self.spec.name} got step {incoming.step} from {source_name} "
                    f"while serving step {step}"
                )
            if incoming.kind == connector.KIND_END:
                running.pop(incoming.source, None)
                continue
            timeline.add(
                FFN_IDLE,
                incoming.layer,
                incoming.ubatch,
                idle_start,
                time.perf_counter(),
                incoming.source,
            )
            _maybe_fault(fault, incoming.layer)
            with timeline.span(RECV, incoming.layer, incoming.ubatch, incoming.source):
                payload = connector.receive_payload(
                    incoming,
                    self.config.hidden_size,
                    self.peer_timeout_s,
                    source_name,
                )
            layer = model.layers[payload.layer]
            result, num_routed = self._compute(layer, payload, timeline)
            routed_rows += num_routed
            with timeline.span(SEND, payload.layer, payload.ubatch, incoming.source):
                sends.append((connector.send_result(incoming.source, result), result))
            served += 1
        for work, _ in sends:
            work.wait()
        return {
            "spans": timeline.spans,
            "served": served,
            "routed_rows": routed_rows,
            "cpu_time_s": time.process_time() - cpu_start,
            "involuntary_switches": involuntary_switches() - switches_start,
            "agreed_fingerprints": agreed,
        }

    @staticmethod
    def _compute(layer, payload: connector.A2EPayload, timeline: Timeline):
        normed, flags = payload.normed, payload.flags
        if bool((flags == connector.FLAG_BOTH).all()):
            with timeline.span(ROUTED_MOE, payload.layer, payload.ubatch):
                routed = layer.experts(normed, payload.topk_ids, payload.topk_weights)
            with timeline.span(SHARED_MOE, payload.layer, payload.ubatch):
                # The same sum as the in-process layer, so one FFN rank is bit-exact.
                return routed + layer.shared_experts(normed), normed.shape[0]
        result = torch.zeros_like(normed)
        routed_rows = torch.nonzero(flags & connector.FLAG_ROUTED).squeeze(1)
        shared_rows = torch.nonzero(flags & connector.FLAG_SHARED).squeeze(1)
        with timeline.span(ROUTED_MOE, payload.layer, payload.ubatch):
            if routed_rows.numel():
                result[routed_rows] = layer.experts(
                    normed[routed_rows],
                    payload.topk_ids[routed_rows],
                    payload.topk_weights[routed_rows],
                )
        with timeline.span(SHARED_MOE, payload.layer, payload.ubatch):
            if shared_rows.numel():
                result[shared_rows] += layer.shared_experts(normed[shared_rows])
        return result, int(routed_rows.numel())


def involuntary_switches() -> int:
    """Times the OS preempted this process so far: other load taking its core."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def _maybe_fault(fault: dict | None, layer: int) -> None:
    """Test hook: fail this FFN rank in a chosen way when it reaches a chosen layer."""
    if fault is None or fault["layer"] != layer:
        return
    mode = fault["mode"]
    if mode == FAULT_KILL:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == FAULT_HANG:
        time.sleep(HANG_SLEEP_S)
    if mode == FAULT_RAISE:
        raise RuntimeError(f"injected failure at layer {layer}")


def agree_on_plans(plans: list | None, timeout_s: float,
                   peers: list[str]) -> list[str] | None:
    """Debug-mode agreement: one fingerprint all-gather over every rank per Attention rank's
    plan (``SplitMismatchError`` on every rank when they differ); the agreed fingerprints.
    An all-gather that does not complete within ``timeout_s`` is a PeerTimeoutError."""
    if plans is None:
        return None
    for plan in plans:
        try:
            agree_on_split(plan, timeout_s=timeout_s)
        except SplitMismatchError:
            raise
        except RuntimeError as exc:
            kind = "timed out" if "Timed out" in str(exc) else "failed"
            raise connector.PeerTimeoutError(
                f"{kind} after <= {timeout_s:.1f}s agreeing on the split plan with "
                f"{', '.join(peers)}: {exc}", peers=peers) from exc
    return [plan.fingerprint() for plan in plans]


def make_role(spec: RankSpec, **kwargs) -> AttentionRole | FfnRole:
    """Role factory run inside the child (picklable by reference).

    The seeded fault named by ``$PYTEST_AFD_FAULT`` (inherited from the parent)
    is applied for the rank's lifetime, so the gates' AFD-process cases run the
    faulty split path too (``pytest_afd.faults``).
    """
    from pytest_afd.backends.cpu.afd.procs import ROLE_ATTENTION
    from pytest_afd.faults import applied_from_env

    role_class = AttentionRole if spec.role == ROLE_ATTENTION else FfnRole
    role = role_class(spec, **kwargs)
    role.seeded_fault = contextlib.ExitStack()
    role.seeded_fault.enter_context(applied_from_env())
    return role
