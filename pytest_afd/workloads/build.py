"""The built :class:`Workload` (prompts, token ids, dataset identity) and its builders."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from pytest_afd.core.backend import PromptRequest
from pytest_afd.workloads.shapes import (
    apportion,
    arrival_times,
    fitted_prefixes,
    scaled_total,
    shape_lengths,
)
from pytest_afd.workloads.spec import (
    DISTRIBUTIONS,
    ORDER_SHUFFLED,
    ORDERS,
    STAGE_B_HIT_RATIOS,
    STREAM_ORDER,
    STREAM_PREFIX,
    STREAM_TOKENS,
    STREAM_WARMUP,
    TOKEN_GENERATOR_VERSION,
    TRACE_OF_DISTRIBUTION,
    UNIFORM,
    WorkloadSpec,
    stream_rng,
)
from pytest_afd.workloads.stats import LengthStats, length_stats


@dataclass(frozen=True)
class Workload:
    """A built workload: lengths in run order and how to make the prompts.

    ``source_indices[i]`` is the generation index of the i-th prompt; token ids
    and request ids follow it, so a shuffled workload holds the same prompts as
    the fixed one, only reordered.
    """

    spec: WorkloadSpec
    prompt_lengths: tuple[int, ...]
    source_indices: tuple[int, ...]
    shared_prefix_tokens: int
    arrival_times_s: tuple[float, ...]
    source: dict[str, Any] = field(default_factory=dict)
    # Per prompt (run order), how many of its tokens are the shared prefix's first ones;
    # empty: every prompt starts with the whole shared prefix.
    prefix_lengths: tuple[int, ...] = ()

    @property
    def cached_prefix_tokens(self) -> tuple[int, ...]:
        """Per prompt, the prefix tokens a warm cache can serve (run order)."""
        return self.prefix_lengths or (self.shared_prefix_tokens,) * self.num_requests

    @property
    def uncached_lengths(self) -> tuple[int, ...]:
        """Per prompt, the tokens left to compute with a warm cache."""
        return tuple(length - cached for length, cached in
                     zip(self.prompt_lengths, self.cached_prefix_tokens, strict=True))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def num_requests(self) -> int:
        return len(self.prompt_lengths)

    @property
    def total_tokens(self) -> int:
        return sum(self.prompt_lengths)

    @cached_property
    def stats(self) -> LengthStats:
        return length_stats(self.prompt_lengths)

    @property
    def designed_hit_tokens(self) -> int:
        """Prefix tokens a warm cache can serve: the design, not a measurement."""
        return sum(self.cached_prefix_tokens)

    @property
    def designed_hit_ratio(self) -> float:
        return self.designed_hit_tokens / self.total_tokens

    def _prefix_ids(self) -> np.ndarray:
        rng = stream_rng(self.spec.seed, STREAM_PREFIX)
        return rng.integers(0, self.spec.vocab_size, size=self.shared_prefix_tokens, dtype=np.int64)

    def _unique_ids(self, source_index: int, count: int) -> np.ndarray:
        rng = stream_rng(self.spec.seed, STREAM_TOKENS, source_index)
        return rng.integers(0, self.spec.vocab_size, size=count, dtype=np.int64)

    def token_ids(self) -> list[np.ndarray]:
        """Per prompt, in run order: the shared prefix then request-unique ids."""
        prefix = self._prefix_ids()
        return [
            np.concatenate([prefix[:cached], self._unique_ids(source, length - cached)])
            for source, length, cached in zip(self.source_indices, self.prompt_lengths,
                                              self.cached_prefix_tokens, strict=True)
        ]

    def prompts(self) -> list[PromptRequest]:
        return [
            PromptRequest(request_id=f"req-{source}", prompt_token_ids=tuple(ids.tolist()))
            for source, ids in zip(self.source_indices, self.token_ids(), strict=True)
        ]

    def prefix_warmup_prompts(self) -> list[PromptRequest]:
        """One prompt that puts the shared prefix in the cache (the steady-state phase)."""
        if not self.shared_prefix_tokens:
            return []
        rng = stream_rng(self.spec.seed, STREAM_WARMUP)
        unique = rng.integers(0, self.spec.vocab_size, size=1, dtype=np.int64)
        ids = np.concatenate([self._prefix_ids(), unique])
        return [PromptRequest(request_id="prefix-warmup", prompt_token_ids=tuple(ids.tolist()))]

    @cached_property
    def content_hash(self) -> str:
        """sha256 of the token ids in run order: the dataset identity."""
        digest = hashlib.sha256(f"afd-workload-v{TOKEN_GENERATOR_VERSION}".encode())
        for ids in self.token_ids():
            digest.update(np.int64(ids.size).tobytes())
            digest.update(ids.astype("<i8").tobytes())
        return digest.hexdigest()

    def describe(self) -> dict[str, Any]:
        """JSON-able facts for the manifest / result (dataset identity, lengths, arrivals)."""
        return {
            "name": self.name,
            "content_hash": self.content_hash,
            "spec": self.spec.to_dict(),
            "num_requests": self.num_requests,
            "prompt_lengths": list(self.prompt_lengths),
            "stats": self.stats.to_dict(),
            "shared_prefix_tokens": self.shared_prefix_tokens,
            "cached_prefix_tokens": list(self.cached_prefix_tokens),
            "uncached_stats": length_stats(self.uncached_lengths).to_dict(),
            "requested_hit_ratio": self.spec.requested_hit_ratio,
            "designed_hit_ratio": self.designed_hit_ratio,
            "arrival": {
                "process": self.spec.arrival,
                "rate_per_s": self.spec.arrival_rate,
                "times_s": list(self.arrival_times_s),
            },
            "source": dict(self.source),
        }


def build_workload(spec: WorkloadSpec) -> Workload:
    """Build the workload a spec describes (deterministic from ``spec.seed``)."""
    shape = shape_lengths(spec)
    total = scaled_total(spec, shape)
    # The hit-0 twin's lengths for every ratio: only the shared part varies (fitted_prefixes).
    lengths = apportion(shape, total)
    prefix, per_prompt = fitted_prefixes(spec, lengths)
    order = np.arange(spec.num_requests)
    if spec.order == ORDER_SHUFFLED:
        order = stream_rng(spec.seed, STREAM_ORDER).permutation(spec.num_requests)
    source: dict[str, Any] = {}
    if spec.distribution in TRACE_OF_DISTRIBUTION:
        source = {
            "trace": TRACE_OF_DISTRIBUTION[spec.distribution],
            "license": "CC-BY-4.0",
            "sampling": spec.trace_sampling,
        }
    return Workload(
        spec=spec,
        prompt_lengths=tuple(int(x) for x in lengths[order]),
        source_indices=tuple(int(x) for x in order),
        shared_prefix_tokens=prefix,
        arrival_times_s=tuple(float(x) for x in arrival_times(spec)),
        source=source,
        prefix_lengths=tuple(int(x) for x in per_prompt[order]) if prefix else (),
    )


def make_workload(distribution: str, **spec_fields: Any) -> Workload:
    """Shorthand: ``make_workload("bimodal", seed=1, scale=1/64)``."""
    return build_workload(WorkloadSpec(distribution=distribution, **spec_fields))


def prefix_cache_workloads(
    ratios: Sequence[float] = STAGE_B_HIT_RATIOS, *, distribution: str = UNIFORM, **spec_fields: Any
) -> list[Workload]:
    """Stage B: one workload per requested hit ratio, same total tokens and seed."""
    return [
        build_workload(
            WorkloadSpec(distribution=distribution, requested_hit_ratio=ratio, **spec_fields)
        )
        for ratio in ratios
    ]


def workload_matrix(
    distributions: Sequence[str] = DISTRIBUTIONS,
    orders: Sequence[str] = ORDERS,
    **spec_fields: Any,
) -> list[Workload]:
    """Stage C: every distribution in every order, sharing seed, total and scale."""
    return [
        build_workload(WorkloadSpec(distribution=distribution, order=order, **spec_fields))
        for distribution in distributions
        for order in orders
    ]


def workload_from_json(text: str) -> Workload:
    """Rebuild a workload from ``json.dumps(workload.spec.to_dict())`` (e.g. from a result)."""
    return build_workload(WorkloadSpec(**json.loads(text)))
