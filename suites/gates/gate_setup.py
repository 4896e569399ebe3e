"""Gate set-up: topologies, backends, page scale, settings and prompts (see docs/gates.md)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

from afd_split.checks.support import CPU_REFERENCE_BUILDER, SplitSupportConfig
from pytest_afd.backends import create_backend
from pytest_afd.core.backend import (
    Backend,
    PromptRequest,
    RunSettings,
)
from pytest_afd.run.options import AfdOptions
from pytest_afd.topology.spec import Topology, parse_topology

CPU_BACKEND = "cpu"
# Small KV pages so prompts of a few hundred tokens span many blocks: prefix
# hits, partial-block reuse and page-aligned chunks all happen at CPU sizes.
GATE_BLOCK_SIZE = 16
# Token ids are drawn below the CPU model's vocabulary (real vocabularies are larger).
PROMPT_VOCAB = 2048
# The topologies whose split arithmetic the CPU backend emulates exactly
# (Topology.cpu_emulation): the recipe's AFD and baseline layouts, a TP-aligned
# AFD layout, and PCP padding combined with TP alignment.
SUPPORTED_CPU_TOPOLOGIES = ("dp3pcp8-ep8", "dp4pcp8", "dp2tp4-ep8", "dp2pcp2tp2-ep4")
# Attention builder the split path is validated for on each backend.
BACKEND_ATTENTION_BUILDERS = MappingProxyType({CPU_BACKEND: CPU_REFERENCE_BUILDER})
NPU_ATTENTION_BUILDER = "AscendSFAMetadataBuilder"
QUANT_NONE = "none"
QUANT_W8A8 = "w8a8"
TOLERANCE_PROFILES = MappingProxyType({QUANT_NONE: "float32", QUANT_W8A8: "w8a8"})
UNSPLIT_POLICY = "none"
SPLIT_POLICY = "token_balanced"


# ---- topologies ------------------------------------------------------------


def gate_topology_specs(options: AfdOptions) -> list[str]:
    """The session's ``--npu-topology`` first, then the other supported CPU topologies.

    A non-CPU backend is one deployment: it runs only the topology it was
    launched with.
    """
    session = options.topology.canonical
    if options.backend != CPU_BACKEND:
        return [session]
    return list(dict.fromkeys((session, *SUPPORTED_CPU_TOPOLOGIES)))


def afd_topology_specs(options: AfdOptions) -> list[str]:
    """The AFD (Attention + FFN) topologies among the gate topologies: the CPU AFD runtime's.

    Only the CPU backend has the in-repo process-pair runtime; elsewhere the
    backend's own AFD deployment is covered through ``Backend.run``.
    """
    if options.backend != CPU_BACKEND:
        return []
    return [s for s in gate_topology_specs(options) if parse_topology(s, options.aliases).is_afd]


def gate_quantization_cases(specs: Sequence[str]) -> list[tuple[str, str]]:
    """Every topology unquantized, plus W8A8 on the first (the session's) topology.

    The split arithmetic depends on the topology, not on the precision, and
    W8A8 quantizes per token (row), so a split cannot change what a token sees;
    one W8A8 topology checks that per-row property at the ``w8a8`` tolerance
    without doubling the sweep.
    """
    return [(spec, QUANT_NONE) for spec in specs] + [(specs[0], QUANT_W8A8)]


def support_config_for(
    topology: Topology, backend_name: str, **overrides: Any
) -> SplitSupportConfig:
    """The fail-closed support facts of running the token split on ``topology``."""
    attention = topology.attention
    facts = {
        "attention_builder": BACKEND_ATTENTION_BUILDERS.get(backend_name, NPU_ATTENTION_BUILDER),
        "pcp_size": attention.size("pcp"),
        "tp_size": max(attention.size("tp"), attention.size("sp")),
        "dcp_size": attention.size("dcp"),
    }
    return SplitSupportConfig(**{**facts, **overrides})


ManifestMaker = Callable[[Backend | None, Topology, str], dict]


@dataclass
class GateBackends:
    """One backend per (topology, model) for the CPU backend, each with its own manifest.

    ``make_manifest(backend, topology, model)`` builds the manifest a case on
    that backend records (its true topology and model, not the session's).
    """

    options: AfdOptions
    session_backend: Callable[[], Backend]
    make_manifest: ManifestMaker
    session_manifest: Callable[[], dict]
    created: dict[tuple[str, str], Backend] = field(default_factory=dict)
    manifests: dict[tuple[str, str], dict] = field(default_factory=dict)

    def manifest(self, spec: str, model_name: str | None = None, *, backend: bool = True) -> dict:
        """The manifest of cases on (``spec``, model); ``backend=False``: no backend ran."""
        model = model_name or self.options.model
        topology = parse_topology(spec, self.options.aliases)
        if self.options.backend != CPU_BACKEND:
            return self.session_manifest()
        key = (topology.canonical, model, backend)
        if key not in self.manifests:
            ran = self.get(spec, model) if backend else None
            self.manifests[key] = self.make_manifest(ran, topology, model)
        return self.manifests[key]

    def get(self, spec: str, model_name: str | None = None) -> Backend:
        model = model_name or self.options.model
        topology = parse_topology(spec, self.options.aliases)
        if self.options.backend != CPU_BACKEND:
            deployment_mismatch(self.options, topology, model)
            return self.session_backend()
        key = (topology.canonical, model)
        if key not in self.created:
            self.created[key] = create_backend(
                CPU_BACKEND,
                topology=topology,
                model_name=model,
                seed=self.options.seed,
                results_dir=self.options.results_dir,
                peer_timeout_s=self.options.peer_timeout_s,
            )
        return self.created[key]

    def close(self) -> None:
        for backend in self.created.values():
            backend.close()
        self.created.clear()


def deployment_mismatch(options: AfdOptions, topology: Topology, model: str) -> None:
    """Skip, naming only what differs, when a case needs another deployment than the session's."""
    differences = []
    if topology.canonical != options.topology.canonical:
        differences.append(f"--npu-topology {topology.canonical} (this session: "
                           f"{options.topology.canonical})")
    if model != options.model:
        differences.append(f"--afd-model {model} (this session: {options.model})")
    if differences:
        pytest.skip(
            f"backend {options.backend!r} runs the one deployment of this session; this case "
            f"needs {' and '.join(differences)}: run it in a session with those options"
        )


@dataclass(frozen=True)
class PageScale:
    """Token counts are written for 16-token CPU pages; scaled to the backend's KV page.

    Cases are about pages (a prefix of six whole pages, a chunk tail shorter
    than a page), so on a backend with 128-token pages every count grows by 8
    and each case keeps its shape.
    """

    block_size: int

    @property
    def factor(self) -> int:
        return self.block_size // GATE_BLOCK_SIZE

    def tokens(self, count: int | None) -> int | None:
        return None if count is None else count * self.factor

    def lengths(self, counts: Sequence[int]) -> tuple[int, ...]:
        return tuple(count * self.factor for count in counts)


def page_scale(backend_name: str) -> PageScale:
    """16-token pages on the CPU backend; the deployment's default page elsewhere."""
    block_size = GATE_BLOCK_SIZE if backend_name == CPU_BACKEND else RunSettings().block_size
    if block_size % GATE_BLOCK_SIZE:
        raise ValueError(f"block_size={block_size} is not a multiple of {GATE_BLOCK_SIZE}")
    return PageScale(block_size)


def gate_settings(topology: Topology, pages: PageScale, **overrides: Any) -> RunSettings:
    """RunSettings for ``topology``: its split alignment / PCP size, the page size, overrides."""
    emulation = topology.cpu_emulation()
    defaults = {
        "split_align": emulation.split_align,
        "pcp_size": emulation.pcp_size,
        "block_size": pages.block_size,
    }
    return RunSettings(**{**defaults, **overrides})


# ---- prompts -----------------------------------------------------------------


def make_prompts(
    lengths: Sequence[int], seed: int, *, prefix: Sequence[int] = (), tag: str = "r"
) -> list[PromptRequest]:
    """Deterministic prompts: ``prefix`` followed by ``length`` random ids each."""
    rng = np.random.default_rng(seed)
    return [
        PromptRequest(
            f"{tag}{index}", tuple(prefix) + tuple(int(t) for t in rng.integers(0, PROMPT_VOCAB, n))
        )
        for index, n in enumerate(lengths)
    ]
