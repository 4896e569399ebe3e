"""Drop-in pieces for the CPU backend: run a step on the AFD runtime like on the Executor.

``AfdExecutor.execute`` has ``Executor.execute``'s signature and returns its
``ExecOutput``, so a backend swaps one for the other; the step's AFD evidence is
kept in ``last_evidence``. ``RankKVCache`` stands in for the parent-side
``PagedKVCache`` a ``BlockPool`` drives: the real cache lives on the Attention
rank, so block growth happens there per forward and a partial prefix-block copy
is forwarded to the rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from afd_split import SplitPlan, plan_split
from afd_split.checks.metadata import BatchMetadata
from pytest_afd.backends.cpu.afd.runtime import AfdRuntime
from pytest_afd.backends.cpu.config import ModelConfig
from pytest_afd.backends.cpu.executor import ExecOutput

UNSPLIT_POLICY = "none"


class AfdExecutor:
    """``Executor``-compatible front of an ``AfdRuntime`` with one Attention rank."""

    def __init__(
        self,
        runtime: AfdRuntime,
        *,
        quantization: str = "none",
        routing: str = "natural",
        instrument: bool = False,
        stage_dense_layers: bool = True,
    ) -> None:
        self.runtime = runtime
        self.quantization = quantization
        self.routing = routing
        self.instrument = instrument
        # True: bit-identical to Executor (gates); False: the CAM recipe's data flow.
        self.stage_dense_layers = stage_dense_layers
        self.last_evidence: dict[str, Any] = {}

    def execute(
        self, input_ids, metadata: BatchMetadata, plan: SplitPlan | None = None
    ) -> ExecOutput:
        """One forward on the AFD ranks; ``plan=None`` runs the batch unsplit, as Executor."""
        if plan is None:
            plan = plan_split(
                metadata.query_lens,
                policy=UNSPLIT_POLICY,
                num_computed_tokens=metadata.num_computed_tokens,
            )
        result = self.runtime.run_forward(
            input_ids,
            metadata,
            plan,
            instrument=self.instrument,
            quantization=self.quantization,
            routing=self.routing,
            stage_dense_layers=self.stage_dense_layers,
        )
        self.last_evidence = result.evidence
        logits = torch.from_numpy(result.logits)
        return ExecOutput(
            last_logits=logits,
            next_tokens=logits.argmax(-1),
            expert_load=np.asarray(result.expert_load, dtype=np.int64).reshape(
                len(self.runtime.config.moe_layer_indices), self.runtime.config.n_routed_experts
            ),
            padding_routed_rows=result.padding_routed_rows,
            ubatch_rows=[ubatch.num_rows for ubatch in plan.ubatches],
        )


class RankKVCache:
    """What ``BlockPool`` needs of a ``PagedKVCache``, backed by an Attention rank's cache."""

    def __init__(self, runtime: AfdRuntime, config: ModelConfig, block_size: int) -> None:
        self.runtime = runtime
        self.config = config
        self.block_size = block_size
        self.num_blocks = 0

    def ensure_blocks(self, num_blocks: int) -> None:
        """Bookkeeping only: each forward grows the rank's cache to its block table."""
        self.num_blocks = max(self.num_blocks, num_blocks)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.runtime.copy_kv_slots(
            np.asarray(src, dtype=np.int64),
            np.asarray(dst, dtype=np.int64),
            block_size=self.block_size,
        )
