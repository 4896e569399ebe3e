"""``AfdRuntime``: the CPU AFD topology as real processes, reusable across forwards.

Usage::

    with AfdRuntime(config, seed, num_attention=1, num_ffn=1) as runtime:
        result = runtime.run_forward(input_ids, metadata, plan, instrument=True)
        result.logits, result.hidden, result.evidence

Spawning costs a few seconds per process (torch import + weights), so one
runtime serves many forwards; any rank failure closes it (and kills every
child) and raises ``AfdRankFailure`` naming the rank.
"""

from __future__ import annotations

import itertools
import os
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from afd_split import SplitPlan
from afd_split.checks.metadata import BatchMetadata
from afd_split.checks.support import (
    CPU_REFERENCE_BUILDER,
    SplitSupportConfig,
    prepare_split_runtime,
)
from afd_split.hook.planning.engine_step import agreement_enabled
from pytest_afd.backends.cpu.afd.cores import cpu_affinity, default_threads_per_rank
from pytest_afd.backends.cpu.afd.forward_step import (
    QUANTIZATION_NONE,
    ROUTING_NATURAL,
    AfdForwardResult,
    StepOptions,
    check_fault,
    forward_messages,
    forward_results,
)
from pytest_afd.backends.cpu.afd.procs import ProcessGroupHandle
from pytest_afd.backends.cpu.afd.protocol import (
    ADDRESS_IN_USE,
    EPHEMERAL_PORT,
    ROLE_ATTENTION,
    ROLE_FFN,
    AfdRankFailure,
    RankSpec,
)
from pytest_afd.backends.cpu.afd.rank import COMMAND_COPY_KV, COMMAND_RESET_KV, RankLayout
from pytest_afd.backends.cpu.afd.roles import make_role
from pytest_afd.backends.cpu.afd.tracing import TRACE_ERROR_KEY
from pytest_afd.backends.cpu.config import ModelConfig

DEFAULT_STARTUP_TIMEOUT_S = 180.0
DEFAULT_STEP_TIMEOUT_S = 600.0
DEFAULT_PEER_TIMEOUT_S = 120.0
STEP_TIMEOUT_MARGIN_S = 5.0
"""The parent's bound outlasts the ranks' own peer waits, so their message (naming the peer) wins."""

MIN_NICE, MAX_NICE = -20, 19  # Linux scheduling niceness range


class AfdRuntime:
    """Attention and FFN ranks as separate processes over gloo on loopback."""

    def __init__(
        self,
        config: ModelConfig,
        seed: int = 0,
        *,
        num_attention: int = 1,
        num_ffn: int = 1,
        threads_per_rank: int | None = None,
        peer_timeout_s: float = DEFAULT_PEER_TIMEOUT_S,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        model_dir: str | None = None,
        support: SplitSupportConfig | None = None,
        pin_cpus: bool = False,
        rank_nice: int = 0,
        check_agreement: bool | None = None,
        rendezvous_port: int = EPHEMERAL_PORT,
    ) -> None:
        """``model_dir``: load weights from a Hugging Face-style directory whose
        ``config.json`` equals ``config`` instead of seeding them. ``support``:
        the deployment facts checked (fail closed) before any rank or gloo group
        exists; default: the CPU reference attention, eager, two stages.
        ``pin_cpus``: pin rank i to the i-th allowed core (round robin), so the
        OS never moves two ranks onto one core (benchmarks). ``rank_nice``: the
        ranks' scheduling niceness (-20..19; negative needs CAP_SYS_NICE), so a
        benchmark can measure the ranks' own schedule on a host shared with
        other work; 0 leaves it as inherited. ``check_agreement``: every rank
        all-gathers each step's plan fingerprints (``afd_split.plan.agree``) before
        any ubatch is exchanged; None: on when ``AFD_SPLIT_DEBUG_AGREE=1``.
        ``rendezvous_port``: the port rank
        0's store binds (default: any free one, picked by the kernel at bind
        time and passed on to the other ranks); a port already taken fails
        rank 0 at once and start-up retries once on a free port."""
        for name, value in (("num_attention", num_attention), ("num_ffn", num_ffn)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}; expected an integer >= 1")
        if num_ffn > config.n_routed_experts:
            raise ValueError(
                f"num_ffn={num_ffn} exceeds n_routed_experts={config.n_routed_experts}: "
                "an FFN rank would own no expert"
            )
        if isinstance(rank_nice, bool) or not isinstance(rank_nice, int) or not (
            MIN_NICE <= rank_nice <= MAX_NICE
        ):
            raise ValueError(f"rank_nice={rank_nice!r}; expected an integer {MIN_NICE}..{MAX_NICE}")
        for name, value in (("peer_timeout_s", peer_timeout_s), ("step_timeout_s", step_timeout_s)):
            if not value > 0:
                raise ValueError(f"{name}={value!r}; expected a positive number of seconds")
        self.config = config
        self.seed = seed
        self.check_agreement = (
            agreement_enabled(os.environ) if check_agreement is None else bool(check_agreement)
        )
        self.topology = RankLayout(num_attention, num_ffn, config.n_routed_experts)
        world = num_attention + num_ffn
        self.threads_per_rank = threads_per_rank or default_threads_per_rank(world)
        self.peer_timeout_s = peer_timeout_s
        self.cpu_affinity = cpu_affinity(world) if pin_cpus else None
        self.rank_nice = rank_nice
        self.step_timeout_s = max(step_timeout_s, peer_timeout_s + STEP_TIMEOUT_MARGIN_S)
        # Instrumented steps also write torch.profiler traces here (docs/profiling.md).
        self.trace_dir: str | None = None
        # The ranks' trace-write failures since trace_dir was set (cpu_run names them).
        self.trace_errors: list[str] = []
        specs = [RankSpec(ROLE_ATTENTION, i, i) for i in range(num_attention)]
        specs += [RankSpec(ROLE_FFN, f, num_attention + f) for f in range(num_ffn)]
        role_kwargs = {
            "config": config,
            "seed": seed,
            "topology": self.topology,
            "peer_timeout_s": peer_timeout_s,
            "model_dir": None if model_dir is None else str(model_dir),
        }
        self._group = prepare_split_runtime(
            support or SplitSupportConfig(attention_builder=CPU_REFERENCE_BUILDER),
            lambda: self._new_group(specs, role_kwargs),
        )
        self._steps = itertools.count()
        self._finalizer = weakref.finalize(self, ProcessGroupHandle.kill_all, self._group)
        try:
            self._group.start(startup_timeout_s, rendezvous_port)
        except AfdRankFailure as failure:
            # A requested port already taken (another runtime holds it): rank 0
            # failed alone, before any other rank started; one retry on a free port.
            if ADDRESS_IN_USE not in str(failure).lower():
                raise
            self._group = self._new_group(specs, role_kwargs)
            self._finalizer.detach()
            self._finalizer = weakref.finalize(self, ProcessGroupHandle.kill_all, self._group)
            self._group.start(startup_timeout_s, EPHEMERAL_PORT)

    def _new_group(self, specs, role_kwargs) -> ProcessGroupHandle:
        return ProcessGroupHandle(
            specs,
            num_threads=self.threads_per_rank,
            collective_timeout_s=self.step_timeout_s,
            role_factory=make_role,
            role_kwargs_for=lambda spec: role_kwargs,
            cpu_affinity=self.cpu_affinity,
            nice=self.rank_nice,
        )

    # ---- introspection -------------------------------------------------------
    @property
    def attention_ranks(self) -> list[int]:
        return [s.global_rank for s in self._group.specs if s.role == ROLE_ATTENTION]

    @property
    def ffn_ranks(self) -> list[int]:
        return [s.global_rank for s in self._group.specs if s.role == ROLE_FFN]

    @property
    def pids(self) -> dict[str, int]:
        """Process id of every rank, by rank name."""
        return {self._group.spec(r).name: pid for r, pid in self._group.pids.items()}

    @property
    def closed(self) -> bool:
        return self._group.closed

    @property
    def rendezvous_port(self) -> int | None:
        """The loopback port rank 0's rendezvous store bound."""
        return self._group.rendezvous_port

    def alive_pids(self) -> list[int]:
        return self._group.alive_pids()

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "afd-cpu-processes",
            "num_attention": self.topology.num_attention,
            "num_ffn": self.topology.num_ffn,
            "expert_ranges": self.topology.expert_ranges(),
            "threads_per_rank": self.threads_per_rank,
            "cpu_affinity": self.cpu_affinity,
            "rank_nice": self.rank_nice,
            "transport": "torch.distributed gloo, TCP loopback",
            "peer_timeout_s": self.peer_timeout_s,
            "step_timeout_s": self.step_timeout_s,
            "check_agreement": self.check_agreement,
        }

    # ---- running -------------------------------------------------------------
    def run_forward(
        self,
        input_ids,
        metadata: BatchMetadata,
        plan: SplitPlan,
        *,
        instrument: bool = False,
        quantization: str = QUANTIZATION_NONE,
        routing: str = ROUTING_NATURAL,
        logits_rows: Sequence[int] | None = None,
        fault: dict | None = None,
        stage_dense_layers: bool = False,
    ) -> AfdForwardResult:
        """One prefill forward on the single Attention rank (1 + F topologies)."""
        if self.topology.num_attention != 1:
            raise ValueError(
                f"run_forward drives one Attention rank; this runtime has "
                f"{self.topology.num_attention}: use run_dp_forward with one batch per rank"
            )
        results = self.run_dp_forward(
            [(input_ids, metadata, plan, logits_rows)],
            instrument=instrument,
            quantization=quantization,
            routing=routing,
            fault=fault,
            stage_dense_layers=stage_dense_layers,
        )
        return results[0]

    def run_dp_forward(
        self,
        batches: Sequence[tuple],
        *,
        instrument: bool = False,
        quantization: str = QUANTIZATION_NONE,
        routing: str = ROUTING_NATURAL,
        fault: dict | None = None,
        stage_dense_layers: bool = False,
    ) -> list[AfdForwardResult]:
        """One step in which Attention rank i runs ``batches[i]`` (data-parallel attention).

        Each batch is ``(input_ids, metadata, plan, logits_rows)``; every rank's
        MoE ubatches share the FFN ranks. Returns one result per Attention rank;
        the step's evidence is attached to each.
        """
        if len(batches) != self.topology.num_attention:
            raise ValueError(
                f"got {len(batches)} batches for {self.topology.num_attention} Attention rank(s)"
            )
        if fault is not None:
            check_fault(fault, self.topology.num_ffn)
        options = StepOptions(
            step=next(self._steps),
            instrument=instrument,
            trace_dir=self.trace_dir if instrument else None,
            quantization=quantization,
            routing=routing,
            stage_dense_layers=stage_dense_layers,
            # Debug mode: every rank agrees on every Attention rank's plan, in rank order.
            agreement_plans=[batch[2] for batch in batches] if self.check_agreement else None,
        )
        messages = forward_messages(
            batches,
            options,
            attention_ranks=self.attention_ranks,
            ffn_ranks=self.ffn_ranks,
            fault=fault,
        )
        replies = self._group.request(messages, self.step_timeout_s)
        self.trace_errors += [reply.pop(TRACE_ERROR_KEY) for reply in replies.values()
                              if isinstance(reply, dict) and TRACE_ERROR_KEY in reply]
        return forward_results(
            replies,
            batches,
            topology=self.topology,
            attention_ranks=self.attention_ranks,
            ffn_ranks=self.ffn_ranks,
            rank_names={rank: self._group.spec(rank).name for rank in replies},
            num_moe_layers=len(self.config.moe_layer_indices),
            instrument=instrument,
            agreement_checked=options.agreement_plans is not None,
        )

    def copy_kv_slots(self, src, dst, *, block_size: int, attention_rank: int = 0) -> None:
        """``PagedKVCache.copy_slots`` on an Attention rank's cache (BlockPool's partial prefix block).

        A parent-side ``BlockPool`` can drive the ranks' cache through a small proxy
        whose ``copy_slots`` calls this and whose ``ensure_blocks`` does nothing
        (each forward grows the rank's cache to its block table).
        """
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        if src.shape != dst.shape:
            raise ValueError(f"copy_kv_slots: src has shape {src.shape}, dst {dst.shape}")
        if not 0 <= attention_rank < self.topology.num_attention:
            raise ValueError(
                f"attention_rank={attention_rank}; expected 0..{self.topology.num_attention - 1}"
            )
        message = (COMMAND_COPY_KV, {"block_size": block_size, "src": src, "dst": dst})
        self._group.request({self.attention_ranks[attention_rank]: message}, self.step_timeout_s)

    def reset_kv_cache(self) -> None:
        """Drop every Attention rank's KV cache (cold prefix cache)."""
        self._group.request(
            {rank: (COMMAND_RESET_KV, {}) for rank in self.attention_ranks}, self.step_timeout_s
        )

    def close(self) -> None:
        self._group.shutdown()
        self._finalizer.detach()

    def __enter__(self) -> AfdRuntime:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

