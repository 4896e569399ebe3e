"""The one small interface every backend implements.

Suites talk to a backend only through :class:`Backend`: they hand it prompts and
:class:`RunSettings` and get :class:`RunOutputs` back. They never branch on the
backend type; a backend declares what it cannot do in ``capabilities`` and the
plugin turns a missing capability into a skip with a reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

import numpy as np

SPLIT_POLICIES = ("none", "request_boundary", "token_balanced", "cost_balanced")
ROUTING_MODES = ("natural", "forced_balanced")
QUANTIZATIONS = ("none", "w8a8")

# Capability names a backend may declare.
CAP_SPLIT = "split"
CAP_PREFIX_CACHE = "prefix_cache"
CAP_CHUNKED_PREFILL = "chunked_prefill"
CAP_W8A8 = "w8a8"
CAP_FORCED_ROUTING = "forced_routing"
CAP_LOGITS = "logits"
# The generated token's top-k logprobs (vLLM's /v1/completions ``logprobs``):
# what a backend behind an HTTP API returns instead of logits.
CAP_TOPK_LOGPROBS = "topk_logprobs"
CAP_AFD = "afd"
CAP_INSTRUMENTATION = "instrumentation"
CAP_PIPELINE_PARALLEL = "pipeline_parallel"
# The backend calls SplitObservers on every split its in-process executor consumes
# (``observe_splits``): the gates check exactly what ran without reaching into it.
CAP_SPLIT_OBSERVER = "split_observer"


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine (missing hardware or packages).

    The plugin turns this into a skip (or a failure under
    ``--afd-require-hardware``); the message says what is missing.
    """


class CapabilityMissing(RuntimeError):
    """A suite asked for something the backend declared it cannot do."""


@dataclass(frozen=True)
class PromptRequest:
    """One prompt to prefill. ``prompt_token_ids`` is the whole logical prompt."""

    request_id: str
    prompt_token_ids: tuple[int, ...]

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class RunSettings:
    """What defines one run of a backend; every field lands in the manifest."""

    split_policy: str = "token_balanced"
    # None means unchunked (chunked prefill disabled).
    chunk_size: int | None = None
    prefix_caching: bool = False
    routing: str = "natural"
    quantization: str = "none"
    max_num_batched_tokens: int = 140_000
    max_num_seqs: int = 8
    block_size: int = 128
    # Split alignment unit (SP/TP size) and PCP size seen by afd_split; None
    # means "the topology's layout" (the CPU backend's documented emulation).
    split_align: int | None = None
    pcp_size: int | None = None
    instrument: bool = False
    # Return what the gates compare: last-token logits, or top-k logprobs on a
    # backend that declares CAP_TOPK_LOGPROBS instead of CAP_LOGITS.
    return_logits: bool = True
    # CPU backend: run the Attention and FFN roles as separate processes (the
    # CPU AFD runtime, capability "afd") instead of in one process. A real AFD
    # deployment always runs them apart, so other backends ignore it.
    afd_processes: bool = False

    def __post_init__(self) -> None:
        if self.split_policy not in SPLIT_POLICIES:
            raise ValueError(f"split_policy={self.split_policy!r}; expected one of {SPLIT_POLICIES}")
        if self.routing not in ROUTING_MODES:
            raise ValueError(f"routing={self.routing!r}; expected one of {ROUTING_MODES}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization={self.quantization!r}; expected one of {QUANTIZATIONS}")
        for name in ("split_align", "pcp_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value!r}; expected a positive integer or None")
        if self.chunk_size is not None and self.chunk_size <= 0:
            raise ValueError(f"chunk_size={self.chunk_size!r}; expected a positive integer or None")

    @property
    def synthetic(self) -> bool:
        """Forced-balanced routing changes expert ids and outputs: never an accuracy claim."""
        return self.routing == "forced_balanced"


def run_settings_from(values: Any, where: str) -> RunSettings:
    """RunSettings from a JSON object (a server's ``--settings-json``, a deployments file's
    entry); not an object, an unknown field or a bad value is a ValueError naming ``where``."""
    if not isinstance(values, Mapping):
        raise ValueError(f"{where}: settings must be a JSON object, got {values!r}")
    known = {item.name for item in fields(RunSettings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{where}: unknown RunSettings fields {unknown}; known: {sorted(known)}")
    try:
        return RunSettings(**values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{where}: {error}") from None


@dataclass
class RequestOutput:
    request_id: str
    num_prompt_tokens: int
    # Realized prefix-cache hit tokens, as the runtime reports them.
    num_cached_tokens: int
    next_token: int
    # Last-token logits (float32, vocab-sized) when the backend can return them.
    logits: np.ndarray | None = None
    # Token id -> logprob of the generated token's top-k (CAP_TOPK_LOGPROBS backends).
    top_logprobs: dict[int, float] | None = None
    ttft_s: float | None = None
    error: str | None = None


@dataclass
class RunOutputs:
    requests: list[RequestOutput]
    # One entry per forward step: the split plan's evidence (policy, realized
    # per-ubatch real/padded tokens, imbalance) plus scheduling facts.
    steps: list[dict[str, Any]] = field(default_factory=list)
    # Why ``steps`` is empty (recorded as the result's absent step evidence, never as
    # zero scheduled tokens); None: the backend gave no reason (a generic one is used).
    steps_absent_reason: str | None = None
    # Per layer: routed tokens per expert (list of lists), natural or forced.
    expert_load: list[list[int]] = field(default_factory=list)
    # Instrumented runs only: per-layer/per-ubatch timings.
    timings: dict[str, Any] = field(default_factory=dict)
    wall_time_s: float = 0.0
    # Peak resident memory of the process that held the model during the run
    # (device memory on NPUs); None when the backend cannot measure it.
    peak_memory_bytes: int | None = None
    # Why peak_memory_bytes is None (recorded as the result's absent_reason).
    peak_memory_absent_reason: str | None = None
    # Host conditions of the run (pytest_afd.stats.host.HostSample), set by host.measured_run.
    host: Any = None
    # Instrumented runs: the profiler-trace evidence (pytest_afd.profiling, the result's
    # evidence.profile); None when no trace was analysed.
    profile: dict[str, Any] | None = None
    # Why ``profile`` is None after an instrumented run (the case's absent reason, issue 45:
    # the traces' directory gone, a rank's file missing or empty, a parse error, the analysis
    # raising); None: not instrumented, or the backend gave no reason.
    profile_absent_reason: str | None = None
    # Measured runs: npu-smi samples (pytest_afd.profiling.device_metrics); None: not sampled.
    device_metrics: dict[str, Any] | None = None

    def by_id(self) -> dict[str, RequestOutput]:
        return {r.request_id: r for r in self.requests}


@runtime_checkable
class Backend(Protocol):
    """A backend is made from (topology, model config, options) by a factory."""

    name: str
    capabilities: frozenset[str]

    def run(self, prompts: Sequence[PromptRequest], settings: RunSettings) -> RunOutputs:
        """Prefill every prompt (output length 1) and return per-request results."""
        ...

    def reset_prefix_cache(self) -> None:
        """Drop cached KV so the next run is cold."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts for the manifest: versions, model, device, topology emulation."""
        ...

    def close(self) -> None: ...


class SplitObserver(Protocol):
    """Sees each split a backend executes: the parent before slicing, then the parts it ran.

    Observers must not keep strong references to what they are shown (the soak
    checks that every plan, metadata and part is dead after its step).
    """

    def before_split(self, plan: Any, metadata: Any) -> None:
        """Called with the parent metadata before ``split_metadata`` runs."""
        ...

    def after_split(self, plan: Any, metadata: Any, parts: Sequence[Any]) -> None:
        """Called with the per-ubatch metadata the executor will run."""
        ...


def observe_splits(backend: Backend, observer: SplitObserver) -> AbstractContextManager[None]:
    """``backend.observe_splits(observer)``: observe every split inside the ``with`` block.

    Needs capability ``split_observer``. A run with ``split_policy="none"``
    is a direct whole-batch forward (no ``afd_split`` slicing, gather or
    merge), so its observer sees no split: the gates' unsplit reference is
    independent of the code they judge.
    """
    require_capability(backend, CAP_SPLIT_OBSERVER)
    return backend.observe_splits(observer)


def require_capability(backend: Backend, capability: str) -> None:
    if capability not in backend.capabilities:
        raise CapabilityMissing(
            f"backend {backend.name!r} does not support {capability!r} "
            f"(it declares {sorted(backend.capabilities)})"
        )
