"""The embedded CPU backend: schedule, plan the split, execute, report evidence.

Each run goes through the same seams a real stack has: the scheduler model
(``pytest_afd.scheduling``: chunking, page admission, prefix hits), the split
planner (``afd_split.plan_split``) and the executor over a paged latent KV
cache whose blocks are reused across runs for prefix hits. Realized cached
tokens come from what the run actually reused, not from the workload spec.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from afd_split import SplitConstraints
from afd_split.checks.metadata import BatchMetadata
from afd_split.hook.planning.engine_step import (
    StepRanks,
    plan_engine_step,
    step_record,
)
from afd_split.hook.planning.worker_evidence import EvidenceSettings
from pytest_afd.backends.cpu.afd import AfdExecutor, AfdRuntime, RankKVCache
from pytest_afd.backends.cpu.afd.runtime import DEFAULT_PEER_TIMEOUT_S
from pytest_afd.backends.cpu.config import ModelConfig
from pytest_afd.backends.cpu.executor import Executor
from pytest_afd.backends.cpu.kv_cache import (
    BlockPool,
    PagedKVCache,
    RequestBlocks,
    validate_block_size,
)
from pytest_afd.backends.cpu.memory import (
    AFD_PROCESSES_REASON,
    NO_PROC_REASON,
    case_peak_bytes,
    current_rss_bytes,
    peak_rss_bytes,
    reset_peak_rss,
    tensors_bytes,
)
from pytest_afd.backends.cpu.model import DeepseekV32Model, num_parameters
from pytest_afd.backends.cpu.run_evidence import (
    add_layer_seconds,
    afd_step_fields,
    load_per_rank,
    split_layout,
    timings_document,
)
from pytest_afd.backends.cpu.weights import weights_digest
from pytest_afd.core.backend import (
    CAP_AFD,
    CAP_CHUNKED_PREFILL,
    CAP_FORCED_ROUTING,
    CAP_INSTRUMENTATION,
    CAP_LOGITS,
    CAP_PREFIX_CACHE,
    CAP_SPLIT,
    CAP_SPLIT_OBSERVER,
    CAP_W8A8,
    PromptRequest,
    RequestOutput,
    RunOutputs,
    RunSettings,
)
from pytest_afd.profiling import cpu_run
from pytest_afd.scheduling import PrefixCacheIndex, SchedulerConfig, schedule

BACKEND_NAME = "cpu"
UNSPLIT_POLICY = "none"
UNUSED_BLOCK = -1
CAPABILITIES = frozenset({
    CAP_SPLIT, CAP_PREFIX_CACHE, CAP_CHUNKED_PREFILL, CAP_W8A8, CAP_FORCED_ROUTING, CAP_LOGITS,
    CAP_INSTRUMENTATION, CAP_AFD, CAP_SPLIT_OBSERVER,
})  # fmt: skip
CPU_STEP_RANKS = StepRanks(global_rank=0)
"""The in-process CPU model is one Attention rank (TP/PCP are emulated in the layout)."""


@dataclass
class _CacheState:
    cache: PagedKVCache | RankKVCache
    pool: BlockPool
    index: PrefixCacheIndex


class CpuBackend:
    """In-process CPU backend implementing the :class:`~pytest_afd.core.backend.Backend` protocol."""

    name = BACKEND_NAME
    capabilities = CAPABILITIES

    def __init__(self, model: DeepseekV32Model, *, topology=None, seed: int | None = None,
                 results_dir: str | Path | None = None, model_dir: str | Path | None = None,
                 peer_timeout_s: float = DEFAULT_PEER_TIMEOUT_S) -> None:
        if not 0 < peer_timeout_s < float("inf"):
            raise ValueError(f"peer_timeout_s={peer_timeout_s!r}; expected seconds > 0")
        self.model = model
        # The AFD runtime's bound on a wait for a peer rank (a frozen rank fails in it).
        self.peer_timeout_s = peer_timeout_s
        # Where pretrained weights came from (None: seeded), for the AFD runtime's ranks.
        self.model_dir = None if model_dir is None else str(model_dir)
        self.config: ModelConfig = model.config
        self.topology = topology
        self.seed = seed
        self.results_dir = None if results_dir is None else Path(results_dir)
        self._variants: dict[tuple[str, str], DeepseekV32Model] = {
            (model.quantization, model.routing): model
        }
        self._caches: dict[int, _CacheState] = {}
        # The CPU AFD runtime (Attention + FFN processes), started by the first
        # run with ``afd_processes`` and reused; its KV cache lives on its rank.
        self._afd_runtime: AfdRuntime | None = None
        self._afd_caches: dict[int, _CacheState] = {}
        self._digest: str | None = None
        self._split_observers: list = []
        # AFD_EVIDENCE_DIR / _MAX_BYTES checked once here: a bad value fails start-up, not each run.
        self._evidence_settings = EvidenceSettings.from_env(os.environ)

    # ---- protocol -------------------------------------------------------
    def run(self, prompts: Sequence[PromptRequest], settings: RunSettings) -> RunOutputs:
        started = time.perf_counter()
        # In-process runs hold the model here; AFD-process runs hold it on the ranks.
        measure_memory = not settings.afd_processes and reset_peak_rss()
        rss_at_start = current_rss_bytes() if measure_memory else None
        token_lists = self._check_prompts(prompts)
        block_size = validate_block_size(settings.block_size)
        layout = split_layout(settings, self.topology)
        if settings.afd_processes:
            self._drop_failed_runtime()
            state = self._afd_cache_state(block_size)
            executor = AfdExecutor(self._runtime(), quantization=settings.quantization,
                                   routing=settings.routing, instrument=settings.instrument)
            traces = cpu_run.start(self._runtime(), settings)  # docs/profiling.md
        else:
            traces = None
            state = self._cache_state(block_size)
            executor = Executor(self._variant(settings.quantization, settings.routing), state.cache,
                                split_observers=tuple(self._split_observers))
        cached = [state.index.lookup(t) if settings.prefix_caching else 0 for t in token_lists]
        sched = schedule(
            [len(t) for t in token_lists],
            config=SchedulerConfig(
                chunk_size=settings.chunk_size, cp_size=layout.pcp_size, page_size=block_size,
                max_batched_tokens=settings.max_num_batched_tokens,
                # vLLM's max_num_seqs bounds the requests of one forward as well.
                max_prefill_reqs=settings.max_num_seqs, max_running_seqs=settings.max_num_seqs,
            ),
            cached_tokens=cached,
        )
        if not sched.valid:
            raise ValueError(f"these run settings cannot be scheduled: {'; '.join(sched.reasons)}")
        constraints = SplitConstraints(align=layout.split_align, pcp_size=layout.pcp_size)
        blocks = [state.pool.allocate(t, c) for t, c in zip(token_lists, cached, strict=True)]
        outputs: dict[int, RequestOutput] = {}
        steps: list[dict[str, Any]] = []
        total_load = np.zeros((len(self.config.moe_layer_indices), self.config.n_routed_experts),
                              dtype=np.int64)
        layer_seconds: list[list[dict[str, float]]] = []
        completed = False
        # AFD_EVIDENCE_DIR: the same per-step lines the engine hook's Attention ranks write.
        evidence = (None if self._evidence_settings is None
                    else self._evidence_settings.writer(CPU_STEP_RANKS.label))
        try:
            for step, batch in enumerate(sched.batches):
                step_started = time.perf_counter()
                metadata = _batch_metadata(batch, blocks, block_size)
                ids = np.concatenate([
                    token_lists[c.request_index][c.num_computed_tokens:c.num_computed_tokens + c.num_tokens]
                    for c in batch.chunks
                ])  # fmt: skip
                # The engine hook's planning; the executors split through the engine glue
                # (engine_glue.split_engine_metadata), which runs the per-step checks.
                plan = plan_engine_step(batch.num_scheduled_tokens, policy=settings.split_policy,
                                        constraints=constraints,
                                        num_computed_tokens=batch.num_computed_tokens)
                if settings.afd_processes:
                    result = executor.execute(ids, metadata, plan)
                    afd_fields = afd_step_fields(executor.last_evidence)
                else:
                    # split_policy "none" is a direct whole-batch forward: no afd_split
                    # slicing, gather or merge, so it is an independent reference.
                    executed = None if settings.split_policy == UNSPLIT_POLICY else plan
                    result = executor.execute(ids, metadata, executed,
                                              instrument=settings.instrument)
                    afd_fields = {}
                total_load += result.expert_load
                add_layer_seconds(layer_seconds, result.layer_seconds)
                now = time.perf_counter()
                for position, chunk in enumerate(batch.chunks):
                    if chunk.is_final:
                        outputs[chunk.request_index] = self._request_output(
                            prompts[chunk.request_index], cached[chunk.request_index],
                            result.last_logits[position], settings, now - started,
                        )
                steps.append(step_record(
                    plan, step=step, ranks=CPU_STEP_RANKS, expert_load=result.expert_load,
                    request_ids=[prompts[c.request_index].request_id for c in batch.chunks],
                    schedule=batch.to_json(),
                    cached_tokens=[cached[c.request_index] for c in batch.chunks],
                    expert_load_per_rank=load_per_rank(result.expert_load,
                                                       layout.num_ep_ranks).tolist(),
                    padding_routed_rows=result.padding_routed_rows,
                    wall_time_s=now - step_started,
                    **afd_fields,
                ))  # fmt: skip
                if evidence is not None:
                    evidence.append(steps[-1])
            completed = True
        finally:
            if evidence is not None:
                evidence.close()
            # A failed run must not publish blocks it may not have written.
            self._finish(state, token_lists, blocks, settings.prefix_caching and completed)
        return cpu_run.finish(traces, RunOutputs(
            requests=[outputs[i] for i in range(len(prompts))],
            steps=steps,
            expert_load=total_load.tolist(),
            timings=timings_document(layer_seconds) if settings.instrument else {},
            wall_time_s=time.perf_counter() - started,
            peak_memory_bytes=case_peak_bytes(
                peak_rss_bytes(), rss_at_start,
                tensors_bytes(self._variant(settings.quantization, settings.routing).weights.values())
                + state.cache.nbytes(),
            ) if measure_memory else None,
            peak_memory_absent_reason=AFD_PROCESSES_REASON if settings.afd_processes
            else None if measure_memory else NO_PROC_REASON,
        ))  # fmt: skip

    @contextlib.contextmanager
    def observe_splits(self, observer) -> Iterator[None]:
        """Show ``observer`` every split the in-process executor runs inside the block."""
        self._split_observers.append(observer)
        try:
            yield
        finally:
            self._split_observers.remove(observer)

    def reset_prefix_cache(self) -> None:
        for state in (*self._caches.values(), *self._afd_caches.values()):
            state.pool.reset()
            state.index.clear()
        self._drop_failed_runtime()
        if self._afd_runtime is not None:
            self._afd_runtime.reset_kv_cache()

    def describe(self) -> dict[str, Any]:
        if self._digest is None:
            self._digest = weights_digest(self.model.weights)
        layout = None if self.topology is None else self.topology.cpu_emulation().to_json()
        return {
            "backend": BACKEND_NAME,
            "device": "cpu",
            "cpu": platform.processor() or platform.machine(),
            "torch_version": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "dtype": "float32",
            "model": {
                "name": self.config.name,
                "seed": self.seed,
                "num_layers": self.config.num_hidden_layers,
                "moe_layers": list(self.config.moe_layer_indices),
                "num_parameters": num_parameters(self.config),
                "weights_sha256": self._digest,
                "config": asdict(self.config),
            },
            "topology_emulation": layout,
            "capabilities": sorted(self.capabilities),
        }

    def close(self) -> None:
        self._caches.clear()
        self._afd_caches.clear()
        self._variants.clear()
        if self._afd_runtime is not None:
            self._afd_runtime.close()
            self._afd_runtime = None

    # ---- helpers ----------------------------------------------------------
    def _check_prompts(self, prompts: Sequence[PromptRequest]) -> list[list[int]]:
        if not prompts:
            raise ValueError("prompts is empty; a run needs at least one request")
        ids = [p.request_id for p in prompts]
        if len(set(ids)) != len(ids):
            duplicate = next(i for i in ids if ids.count(i) > 1)
            raise ValueError(f"request_id {duplicate!r} appears more than once")
        token_lists = []
        for prompt in prompts:
            tokens = list(prompt.prompt_token_ids)
            if not tokens:
                raise ValueError(f"request {prompt.request_id!r} has an empty prompt")
            bad = [t for t in tokens if not 0 <= t < self.config.vocab_size]
            if bad:
                raise ValueError(
                    f"request {prompt.request_id!r}: token id {bad[0]} is outside the "
                    f"vocabulary [0, {self.config.vocab_size})"
                )
            token_lists.append(tokens)
        return token_lists

    def _variant(self, quantization: str, routing: str) -> DeepseekV32Model:
        key = (quantization, routing)
        if key not in self._variants:
            self._variants[key] = self.model.variant(quantization=quantization, routing=routing)
        return self._variants[key]

    def _runtime(self) -> AfdRuntime:
        """Start the AFD runtime once: 1 Attention rank, the topology's FFN processes."""
        if self._afd_runtime is None:
            emulation = None if self.topology is None else self.topology.cpu_emulation()
            num_ffn = max(1, emulation.ffn_processes) if emulation is not None else 1
            # check_agreement: the CPU backend is a test harness, so it always runs the
            # hook's debug-mode fingerprint agreement (one all-gather per step).
            self._afd_runtime = AfdRuntime(self.config, self.seed or 0, num_attention=1,
                                           num_ffn=num_ffn, model_dir=self.model_dir,
                                           peer_timeout_s=self.peer_timeout_s,
                                           check_agreement=True)
        return self._afd_runtime

    def _drop_failed_runtime(self) -> None:
        """A rank failure closed the runtime and its KV cache: the next run starts a fresh one."""
        if self._afd_runtime is not None and self._afd_runtime.closed:
            self._afd_runtime = None
            self._afd_caches.clear()

    def _afd_cache_state(self, block_size: int) -> _CacheState:
        if block_size not in self._afd_caches:
            cache = RankKVCache(self._runtime(), self.config, block_size)
            self._afd_caches[block_size] = _CacheState(
                cache, BlockPool(cache), PrefixCacheIndex(block_size)
            )
        return self._afd_caches[block_size]

    def _cache_state(self, block_size: int) -> _CacheState:
        if block_size not in self._caches:
            cache = PagedKVCache(self.config, block_size)
            self._caches[block_size] = _CacheState(cache, BlockPool(cache), PrefixCacheIndex(block_size))
        return self._caches[block_size]

    @staticmethod
    def _request_output(prompt: PromptRequest, cached: int, logits: torch.Tensor,
                        settings: RunSettings, ttft: float) -> RequestOutput:
        return RequestOutput(
            request_id=prompt.request_id,
            num_prompt_tokens=prompt.num_prompt_tokens,
            num_cached_tokens=cached,
            next_token=int(logits.argmax()),
            logits=logits.numpy().astype(np.float32) if settings.return_logits else None,
            ttft_s=ttft,
        )

    @staticmethod
    def _finish(state: _CacheState, token_lists: list[list[int]], blocks: list[RequestBlocks],
                keep_prefix: bool) -> None:
        for tokens, request_blocks in zip(token_lists, blocks, strict=True):
            state.pool.finish(tokens, request_blocks, keep_prefix=keep_prefix)
            if keep_prefix:
                state.index.insert(tokens)


def _batch_metadata(batch, blocks: list[RequestBlocks], block_size: int) -> BatchMetadata:
    """Metadata of one scheduled forward, addressing each request's own blocks."""
    rows = [blocks[c.request_index].block_ids for c in batch.chunks]
    table = np.full((len(rows), max(len(r) for r in rows)), UNUSED_BLOCK, dtype=np.int64)
    for i, row in enumerate(rows):
        table[i, :len(row)] = row
    return BatchMetadata.from_requests(batch.num_scheduled_tokens, batch.num_computed_tokens,
                                       table, block_size)
