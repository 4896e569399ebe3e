"""What every AFD rank holds, Attention or FFN: the rank layout, the model, the agreement.

The roles themselves live in :mod:`.attention` (embeddings, attention, gate, dense MLP,
KV cache) and :mod:`.ffn` (the expert server); :mod:`.experts` holds how a ubatch's rows
are sharded over FFN ranks and what an FFN rank computes for them; :mod:`.roles` is the
factory the child processes run.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import numpy as np

from afd_split import SplitMismatchError
from afd_split.plan.agree import agree_on_split
from pytest_afd.backends.cpu.afd import connector
from pytest_afd.backends.cpu.afd.protocol import RankSpec
from pytest_afd.backends.cpu.config import ModelConfig
from pytest_afd.backends.cpu.model import DeepseekV32Model, build_model
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
class RankLayout:
    """Rank layout shared by every process: Attention ranks first, then FFN ranks.

    (Not :class:`pytest_afd.topology.spec.Topology`, the deployment a run names: this is the
    emulation's own process layout derived from it.)
    """

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


class ModelVariants:
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


class Role:
    """What every rank holds: its spec, the model config and weights, the topology."""

    def __init__(
        self,
        spec: RankSpec,
        *,
        config: ModelConfig,
        seed: int,
        topology: RankLayout,
        peer_timeout_s: float,
        model_dir: str | None = None,
    ) -> None:
        self.spec = spec
        self.config = config
        self.topology = topology
        self.peer_timeout_s = peer_timeout_s
        self.models = ModelVariants(config, seed, model_dir)

    def agree(self, plans: list | None) -> list[str] | None:
        """The step's fingerprint agreement, bounded by the peer timeout like every other
        wait on a peer (a frozen rank would otherwise hold the all-gather for the whole
        step timeout); a timeout blames every other rank, since any of them may be stuck."""
        topology = self.topology
        names = [topology.attention_name(index) for index in range(topology.num_attention)]
        names += [topology.ffn_name(index) for index in range(topology.num_ffn)]
        return agree_on_plans(plans, self.peer_timeout_s,
                              [name for name in names if name != self.spec.name])


def involuntary_switches() -> int:
    """Times the OS preempted this process so far: other load taking its core."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


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
