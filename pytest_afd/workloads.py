"""Deterministic prefill workloads for the RFC's stages.

A workload is a list of prompts (lengths, an optional shared prefix, token ids)
plus arrival times, all derived from a :class:`WorkloadSpec` and its seed, so
two runs of the same spec prefill exactly the same tokens. Distributions can be
normalised to the same total logical prompt tokens (``target_total_tokens``) so
Stage C compares shapes, not sizes, and scaled down (``scale``) so the CPU
backend runs the same shapes small.

Random streams are keyed by purpose (lengths, order, arrivals, tokens), so
changing the order or the arrival process never changes the lengths, and
"shuffled" is a permutation of exactly the "fixed" prompts.
"""

from __future__ import annotations

import csv
import datetime as dt
import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from typing import Any

import numpy as np

from pytest_afd.backends.base import PromptRequest

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
_STREAM_LENGTHS = 0
_STREAM_ORDER = 1
_STREAM_ARRIVAL = 2
_STREAM_TOKENS = 3
_STREAM_PREFIX = 4
_STREAM_TRACE_WINDOW = 5
_STREAM_WARMUP = 6

# --- the shipped Azure LLM inference trace 2023 (CC-BY-4.0, see data/) -------
TRACE_NAMES = ("conv", "code")
_TRACE_PACKAGE_DIR = "azure-llm-2023"
_TRACE_FILE = "AzureLLMInferenceTrace_{name}.csv"
_TRACE_OF_DISTRIBUTION = {TRACE_CONV: "conv", TRACE_CODE: "code"}
_SECONDS_PER_DAY = 86400
_SECONDS_PER_HOUR = 3600
_SECONDS_PER_MINUTE = 60

PERCENTILES = (50, 90, 99)
P90 = 90


@dataclass(frozen=True)
class Trace:
    """One shipped trace in arrival order; arrays are read-only."""

    name: str
    prompt_lengths: np.ndarray  # int64, ContextTokens
    output_lengths: np.ndarray  # int64, GeneratedTokens
    arrival_s: np.ndarray  # float64, seconds since the first request

    def __len__(self) -> int:
        return int(self.prompt_lengths.size)


def _parse_timestamp(text: str) -> tuple[int, float]:
    """``2023-11-16 18:17:03.9799600`` -> (day ordinal, seconds of day).

    Parsed by hand: 7 fractional digits break ``fromisoformat`` on Python 3.10,
    and keeping the day apart keeps sub-millisecond gaps exact in float64.
    """
    day_text, clock_text = text.strip().split(" ")
    hours, minutes, seconds = clock_text.split(":")
    seconds_of_day = int(hours) * _SECONDS_PER_HOUR + int(minutes) * _SECONDS_PER_MINUTE
    return dt.date.fromisoformat(day_text).toordinal(), seconds_of_day + float(seconds)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@functools.lru_cache(maxsize=len(TRACE_NAMES))
def load_trace(name: str) -> Trace:
    """Read a shipped trace (``"conv"`` or ``"code"``); cached because suites reuse it."""
    if name not in TRACE_NAMES:
        raise ValueError(f"trace={name!r}; expected one of {TRACE_NAMES}")
    path = (
        resources.files("pytest_afd") / "data" / _TRACE_PACKAGE_DIR / _TRACE_FILE.format(name=name)
    )
    days, seconds, prompts, outputs = [], [], [], []
    with path.open("r", encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            day, second = _parse_timestamp(row["TIMESTAMP"])
            days.append(day)
            seconds.append(second)
            prompts.append(int(row["ContextTokens"]))
            outputs.append(int(row["GeneratedTokens"]))
    day_offsets = np.asarray(days, dtype=np.int64) - days[0]
    arrival = day_offsets * float(_SECONDS_PER_DAY) + (np.asarray(seconds) - seconds[0])
    return Trace(
        name=name,
        prompt_lengths=_read_only(np.asarray(prompts, dtype=np.int64)),
        output_lengths=_read_only(np.asarray(outputs, dtype=np.int64)),
        arrival_s=_read_only(arrival),
    )


# --- statistics ---------------------------------------------------------------
@dataclass(frozen=True)
class LengthStats:
    """Prompt-length statistics the RFC asks every dataset to record."""

    count: int
    total: int
    mean: float
    std: float  # sample standard deviation (n - 1), as pytest_afd.stats.summarize; 0 for one prompt
    cv: float  # std / mean
    min: int
    max: int
    p50: float
    p90: float
    p99: float

    def to_dict(self) -> dict[str, float | int]:
        return {
            "count": self.count,
            "total": self.total,
            "mean": self.mean,
            "std": self.std,
            "cv": self.cv,
            "min": self.min,
            "max": self.max,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
        }


def length_stats(lengths: Sequence[int] | np.ndarray) -> LengthStats:
    """Statistics of prompt lengths (percentiles by linear interpolation)."""
    values = np.asarray(lengths, dtype=np.int64)
    if values.size == 0:
        raise ValueError("length_stats: no lengths given")
    mean = float(values.mean())
    std = float(values.std(ddof=1)) if values.size > 1 else 0.0
    p50, p90, p99 = (float(p) for p in np.percentile(values, PERCENTILES))
    return LengthStats(
        count=int(values.size),
        total=int(values.sum()),
        mean=mean,
        std=std,
        cv=std / mean if mean else 0.0,
        min=int(values.min()),
        max=int(values.max()),
        p50=p50,
        p90=p90,
        p99=p99,
    )


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


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


# --- length shapes (logical scale, generation order) ----------------------------
def _spread_positions(count: int, among: int) -> np.ndarray:
    """``count`` indices spread evenly over ``range(among)``: the neutral 'fixed' layout."""
    return ((np.arange(count) + 0.5) * among / count).astype(np.int64)


def _bimodal_lengths(num_requests: int) -> np.ndarray:
    num_long = max(1, round(num_requests * BIMODAL_LONG_FRACTION))
    lengths = np.full(num_requests, BIMODAL_SHORT_TOKENS, dtype=np.float64)
    lengths[_spread_positions(num_long, num_requests)] = BIMODAL_LONG_TOKENS
    return lengths


def _trace_rows(spec: WorkloadSpec, trace: Trace) -> np.ndarray:
    """Row indices of the trace a trace-derived workload uses."""
    if spec.trace_sampling == TRACE_SAMPLING_WINDOW:
        return _trace_window(spec, trace)
    rng = _rng(spec.seed, _STREAM_LENGTHS)
    replace = spec.num_requests > len(trace)
    return rng.choice(len(trace), size=spec.num_requests, replace=replace)


def _trace_window(spec: WorkloadSpec, trace: Trace) -> np.ndarray:
    if spec.num_requests > len(trace):
        raise ValueError(
            f"num_requests={spec.num_requests} exceeds the {trace.name!r} trace's "
            f"{len(trace)} requests; use trace_sampling={TRACE_SAMPLING_RANDOM!r}"
        )
    start = int(
        _rng(spec.seed, _STREAM_TRACE_WINDOW).integers(0, len(trace) - spec.num_requests + 1)
    )
    return np.arange(start, start + spec.num_requests)


def _shape_lengths(spec: WorkloadSpec) -> np.ndarray:
    """Unnormalised prompt lengths (float, logical tokens) in generation order."""
    n = spec.num_requests
    rng = _rng(spec.seed, _STREAM_LENGTHS)
    if spec.distribution == UNIFORM:
        return np.full(n, DEFAULT_MEAN_PROMPT_TOKENS, dtype=np.float64)
    if spec.distribution == NARROW:
        sigma = np.sqrt(np.log1p(NARROW_CV**2))
        mu = np.log(DEFAULT_MEAN_PROMPT_TOKENS) - sigma**2 / 2
        return rng.lognormal(mu, sigma, size=n)
    if spec.distribution == BIMODAL:
        return _bimodal_lengths(n)
    if spec.distribution == ADVERSARIAL:
        # Same lengths as bimodal, long requests clustered at the front.
        return np.sort(_bimodal_lengths(n))[::-1].copy()
    if spec.distribution == HEAVY_TAILED:
        pareto = HEAVY_TAIL_MIN_TOKENS * (1.0 + rng.pareto(HEAVY_TAIL_ALPHA, size=n))
        return np.minimum(pareto, MAX_CONTEXT_TOKENS)
    if spec.distribution == LONG_SHORT:
        lengths = np.full(n, LONG_SHORT_SHORT_TOKENS, dtype=np.float64)
        lengths[0] = LONG_SHORT_LONG_TOKENS
        return lengths
    trace = load_trace(_TRACE_OF_DISTRIBUTION[spec.distribution])
    return trace.prompt_lengths[_trace_rows(spec, trace)].astype(np.float64)


def apportion(weights: Sequence[float] | np.ndarray, total: int) -> np.ndarray:
    """Integers >= 1 proportional to ``weights`` that sum exactly to ``total``.

    Largest-remainder rounding; where the floor of 1 pushes the sum over, the
    largest entries give tokens back, so the shape is kept as far as it can be.
    """
    shares = np.asarray(weights, dtype=np.float64)
    if shares.size == 0 or np.any(shares <= 0) or not np.all(np.isfinite(shares)):
        raise ValueError(f"apportion: weights must be finite and > 0, got {shares.tolist()[:8]}")
    if total < shares.size:
        raise ValueError(f"apportion: total={total} is less than {shares.size} entries of >= 1")
    exact = shares * (total / shares.sum())
    result = np.maximum(np.floor(exact).astype(np.int64), 1)
    missing = total - int(result.sum())
    if missing > 0:
        remainders = exact - np.floor(exact)
        order = np.argsort(-remainders, kind="stable")
        for step in range(missing):
            result[order[step % order.size]] += 1
    while missing < 0:
        result[int(np.argmax(result))] -= 1
        missing += 1
    return result


def _scaled_total(spec: WorkloadSpec, shape: np.ndarray) -> int:
    """Total prompt tokens after normalising to the logical target and scaling (>= 1 per prompt)."""
    logical_total = (
        spec.target_total_tokens
        if spec.target_total_tokens is not None
        else int(np.round(shape).clip(min=1).sum())
    )
    return max(spec.num_requests, round(logical_total * spec.scale))


def _shared_prefix_tokens(spec: WorkloadSpec, total: int) -> int:
    """Whole-block prefix every prompt starts with, so cached / total ~ the requested ratio."""
    if spec.requested_hit_ratio == 0:
        return 0
    per_request = spec.requested_hit_ratio * total / spec.num_requests
    blocks = round(per_request / spec.block_size)
    prefix = blocks * spec.block_size
    if prefix == 0:
        raise ValueError(
            f"requested_hit_ratio={spec.requested_hit_ratio} gives a shared prefix of "
            f"{per_request:.1f} tokens, under one block of block_size={spec.block_size}; "
            "raise scale or target_total_tokens, or lower block_size"
        )
    if (prefix + 1) * spec.num_requests > total:
        raise ValueError(
            f"requested_hit_ratio={spec.requested_hit_ratio}: a {prefix}-token prefix "
            f"(block_size={spec.block_size}) leaves no unique token per prompt in "
            f"{total} total tokens"
        )
    return prefix


# --- arrivals -------------------------------------------------------------------
def _arrival_times(spec: WorkloadSpec) -> np.ndarray:
    n = spec.num_requests
    if spec.arrival == ARRIVAL_ALL_AT_ONCE:
        return np.zeros(n)
    if spec.arrival == ARRIVAL_POISSON:
        assert spec.arrival_rate is not None  # checked by the spec
        gaps = _rng(spec.seed, _STREAM_ARRIVAL).exponential(1.0 / spec.arrival_rate, size=n)
        gaps[0] = 0.0
        return np.cumsum(gaps)
    trace_name = _TRACE_OF_DISTRIBUTION.get(spec.distribution, spec.arrival_trace)
    trace = load_trace(trace_name)
    rows = _trace_window(spec, trace)
    stamps = trace.arrival_s[rows]
    return stamps - stamps[0]


# --- the workload ------------------------------------------------------------------
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
        return self.shared_prefix_tokens * self.num_requests

    @property
    def designed_hit_ratio(self) -> float:
        return self.designed_hit_tokens / self.total_tokens

    def _prefix_ids(self) -> np.ndarray:
        rng = _rng(self.spec.seed, _STREAM_PREFIX)
        return rng.integers(0, self.spec.vocab_size, size=self.shared_prefix_tokens, dtype=np.int64)

    def _unique_ids(self, source_index: int, count: int) -> np.ndarray:
        rng = _rng(self.spec.seed, _STREAM_TOKENS, source_index)
        return rng.integers(0, self.spec.vocab_size, size=count, dtype=np.int64)

    def token_ids(self) -> list[np.ndarray]:
        """Per prompt, in run order: the shared prefix then request-unique ids."""
        prefix = self._prefix_ids()
        return [
            np.concatenate([prefix, self._unique_ids(source, length - prefix.size)])
            for source, length in zip(self.source_indices, self.prompt_lengths, strict=True)
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
        rng = _rng(self.spec.seed, _STREAM_WARMUP)
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
    shape = _shape_lengths(spec)
    total = _scaled_total(spec, shape)
    prefix = _shared_prefix_tokens(spec, total)
    unique = apportion(shape, total - prefix * spec.num_requests)
    lengths = unique + prefix
    order = np.arange(spec.num_requests)
    if spec.order == ORDER_SHUFFLED:
        order = _rng(spec.seed, _STREAM_ORDER).permutation(spec.num_requests)
    source: dict[str, Any] = {}
    if spec.distribution in _TRACE_OF_DISTRIBUTION:
        source = {
            "trace": _TRACE_OF_DISTRIBUTION[spec.distribution],
            "license": "CC-BY-4.0",
            "sampling": spec.trace_sampling,
        }
    return Workload(
        spec=spec,
        prompt_lengths=tuple(int(x) for x in lengths[order]),
        source_indices=tuple(int(x) for x in order),
        shared_prefix_tokens=prefix,
        arrival_times_s=tuple(float(x) for x in _arrival_times(spec)),
        source=source,
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


# --- the issue-2 motivation: request-boundary imbalance on real traffic -----------
@dataclass(frozen=True)
class BoundaryImbalance:
    """|t0 - t1| / T of the best request-boundary split, per replayed batch."""

    per_batch: np.ndarray
    max_batch_requests: int

    @property
    def mean(self) -> float:
        return float(self.per_batch.mean())

    @property
    def p90(self) -> float:
        return float(np.percentile(self.per_batch, P90))

    @property
    def unsplittable_fraction(self) -> float:
        """Batches with a single request: a request-boundary split cannot cut them."""
        return float(np.mean(self.per_batch == 1.0))


def best_boundary_imbalance(batch_lengths: Sequence[int] | np.ndarray) -> float:
    """min over interior request boundaries of |t0 - t1| / T; 1.0 when it cannot split."""
    lengths = np.asarray(batch_lengths, dtype=np.int64)
    total = int(lengths.sum())
    if lengths.size < 2 or total == 0:  # noqa: PLR2004 - a split needs two requests
        return 1.0
    head = np.cumsum(lengths)[:-1]
    return float(np.min(np.abs(2 * head - total)) / total)


def request_boundary_imbalance(
    prompt_lengths: Sequence[int] | np.ndarray, *, max_batch_requests: int = DEFAULT_NUM_REQUESTS
) -> BoundaryImbalance:
    """Replay lengths in arrival order into batches of at most ``max_batch_requests``."""
    if max_batch_requests < 1:
        raise ValueError(f"max_batch_requests={max_batch_requests!r}; expected >= 1")
    lengths = np.asarray(prompt_lengths, dtype=np.int64)
    if lengths.size == 0:
        raise ValueError("request_boundary_imbalance: no prompt lengths given")
    per_batch = np.array(
        [
            best_boundary_imbalance(lengths[start : start + max_batch_requests])
            for start in range(0, lengths.size, max_batch_requests)
        ]
    )
    return BoundaryImbalance(per_batch=per_batch, max_batch_requests=max_batch_requests)


def trace_boundary_imbalance(
    name: str, *, max_batch_requests: int = DEFAULT_NUM_REQUESTS
) -> BoundaryImbalance:
    """The issue-2 motivation on a shipped trace."""
    return request_boundary_imbalance(
        load_trace(name).prompt_lengths, max_batch_requests=max_batch_requests
    )
