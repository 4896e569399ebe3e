"""Workload names and the :class:`WorkloadSpec`: everything that defines a workload.

Random streams are keyed by purpose (lengths, order, arrivals, tokens), so
changing the order or the arrival process never changes the lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# --- distributions -----------------------------------------------------------
UNIFORM = "uniform"
NARROW = "narrow"
BIMODAL = "bimodal"
HEAVY_TAILED = "heavy_tailed"
TRACE_CONV = "trace_conv"
TRACE_CODE = "trace_code"
LONG_SHORT = "long_short"
ADVERSARIAL = "adversarial"
DISTRIBUTIONS = (
    UNIFORM,
    NARROW,
    BIMODAL,
    HEAVY_TAILED,
    TRACE_CONV,
    TRACE_CODE,
    LONG_SHORT,
    ADVERSARIAL,
)

ORDER_FIXED = "fixed"
ORDER_SHUFFLED = "shuffled"
ORDERS = (ORDER_FIXED, ORDER_SHUFFLED)

ARRIVAL_ALL_AT_ONCE = "all_at_once"
ARRIVAL_POISSON = "poisson"
ARRIVAL_TRACE = "trace"
ARRIVAL_PROCESSES = (ARRIVAL_ALL_AT_ONCE, ARRIVAL_POISSON, ARRIVAL_TRACE)

TRACE_SAMPLING_RANDOM = "random"
TRACE_SAMPLING_WINDOW = "window"
TRACE_SAMPLINGS = (TRACE_SAMPLING_RANDOM, TRACE_SAMPLING_WINDOW)

# The hit ratios the RFC's Stage B sweeps.
STAGE_B_HIT_RATIOS = (0.0, 0.25, 0.5, 0.75, 0.9)

# --- shape parameters at full (logical) scale ---------------------------------
# The recipe's --max-num-seqs: one prefill batch holds at most 8 requests.
DEFAULT_NUM_REQUESTS = 8
DEFAULT_MEAN_PROMPT_TOKENS = 4096
# Narrow production-like: lognormal with this coefficient of variation.
NARROW_CV = 0.1
BIMODAL_SHORT_TOKENS = 1024
BIMODAL_LONG_TOKENS = 16384
BIMODAL_LONG_FRACTION = 0.25
# Heavy tail: Pareto (type I) with this shape, capped at the model's context.
HEAVY_TAIL_ALPHA = 1.5
HEAVY_TAIL_MIN_TOKENS = 512
MAX_CONTEXT_TOKENS = 131072
LONG_SHORT_LONG_TOKENS = 32768
LONG_SHORT_SHORT_TOKENS = 1024
# DeepSeek V3.x tokenizer vocabulary; the CPU models are smaller: pass their vocab_size.
DEFAULT_VOCAB_SIZE = 129280
DEFAULT_BLOCK_SIZE = 128

# Bumped whenever the token-id generator changes, so old hashes stop matching.
TOKEN_GENERATOR_VERSION = 1

# Independent random streams, keyed by purpose (never reorder these values).
STREAM_LENGTHS = 0
STREAM_ORDER = 1
STREAM_ARRIVAL = 2
STREAM_TOKENS = 3
STREAM_PREFIX = 4
STREAM_TRACE_WINDOW = 5
STREAM_WARMUP = 6

# The shipped Azure LLM inference traces 2023 (CC-BY-4.0, see data/).
TRACE_NAMES = ("conv", "code")
TRACE_OF_DISTRIBUTION = {TRACE_CONV: "conv", TRACE_CODE: "code"}


# --- the spec -------------------------------------------------------------------
@dataclass(frozen=True)
class WorkloadSpec:
    """Everything that defines a workload; two equal specs build identical workloads.

    ``target_total_tokens`` is in logical (full-scale) tokens; ``scale`` then
    shrinks every length (and the total) for the CPU backend, never below 1.
    ``block_size`` is the KV block size of the backend that will run it, in
    scaled tokens: a shared prefix is a whole number of blocks so it can hit.
    """

    distribution: str
    num_requests: int = DEFAULT_NUM_REQUESTS
    order: str = ORDER_FIXED
    seed: int = 0
    target_total_tokens: int | None = None
    scale: float = 1.0
    vocab_size: int = DEFAULT_VOCAB_SIZE
    requested_hit_ratio: float = 0.0
    block_size: int = DEFAULT_BLOCK_SIZE
    arrival: str = ARRIVAL_ALL_AT_ONCE
    arrival_rate: float | None = None  # requests per second, Poisson only
    arrival_trace: str = "conv"  # timestamps source for non-trace distributions
    trace_sampling: str = TRACE_SAMPLING_RANDOM

    def __post_init__(self) -> None:
        _check_choice("distribution", self.distribution, DISTRIBUTIONS)
        _check_choice("order", self.order, ORDERS)
        _check_choice("arrival", self.arrival, ARRIVAL_PROCESSES)
        _check_choice("arrival_trace", self.arrival_trace, TRACE_NAMES)
        _check_choice("trace_sampling", self.trace_sampling, TRACE_SAMPLINGS)
        if self.seed < 0:
            raise ValueError(f"seed={self.seed!r}; expected a non-negative integer")
        if self.num_requests < 1:
            raise ValueError(f"num_requests={self.num_requests!r}; expected >= 1")
        if not self.scale > 0:
            raise ValueError(f"scale={self.scale!r}; expected > 0")
        if self.target_total_tokens is not None and self.target_total_tokens < self.num_requests:
            raise ValueError(
                f"target_total_tokens={self.target_total_tokens!r}; expected >= "
                f"num_requests={self.num_requests} (every prompt needs a token)"
            )
        if self.vocab_size < 2:  # noqa: PLR2004 - two distinct ids is the minimum
            raise ValueError(f"vocab_size={self.vocab_size!r}; expected >= 2")
        if not 0.0 <= self.requested_hit_ratio < 1.0:
            raise ValueError(
                f"requested_hit_ratio={self.requested_hit_ratio!r}; expected 0 <= ratio < 1 "
                "(at least one token per prompt must be computed)"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size!r}; expected >= 1")
        if self.arrival == ARRIVAL_POISSON and not (
            self.arrival_rate is not None and self.arrival_rate > 0
        ):
            raise ValueError(
                f"arrival_rate={self.arrival_rate!r}; Poisson arrivals need a rate > 0 (requests/s)"
            )
        if self.arrival != ARRIVAL_POISSON and self.arrival_rate is not None:
            raise ValueError(
                f"arrival_rate={self.arrival_rate!r} given with arrival={self.arrival!r}; "
                "a rate only applies to Poisson arrivals"
            )

    @property
    def name(self) -> str:
        parts = [self.distribution, self.order]
        if self.requested_hit_ratio:
            parts.append(f"hit{round(self.requested_hit_ratio * 100)}")
        return "-".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "distribution": self.distribution,
            "num_requests": self.num_requests,
            "order": self.order,
            "seed": self.seed,
            "target_total_tokens": self.target_total_tokens,
            "scale": self.scale,
            "vocab_size": self.vocab_size,
            "requested_hit_ratio": self.requested_hit_ratio,
            "block_size": self.block_size,
            "arrival": self.arrival,
            "arrival_rate": self.arrival_rate,
            "arrival_trace": self.arrival_trace,
            "trace_sampling": self.trace_sampling,
        }


def _check_choice(field_name: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{field_name}={value!r}; expected one of {choices}")


def stream_rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])
