"""Prompt lengths (logical scale, generation order), their scaling and the arrival times."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pytest_afd.workloads.spec import (
    ADVERSARIAL,
    ARRIVAL_ALL_AT_ONCE,
    ARRIVAL_POISSON,
    BIMODAL,
    BIMODAL_LONG_FRACTION,
    BIMODAL_LONG_TOKENS,
    BIMODAL_SHORT_TOKENS,
    DEFAULT_MEAN_PROMPT_TOKENS,
    HEAVY_TAIL_ALPHA,
    HEAVY_TAIL_MIN_TOKENS,
    HEAVY_TAILED,
    LONG_SHORT,
    LONG_SHORT_LONG_TOKENS,
    LONG_SHORT_SHORT_TOKENS,
    MAX_CONTEXT_TOKENS,
    NARROW,
    NARROW_CV,
    STREAM_ARRIVAL,
    STREAM_LENGTHS,
    STREAM_TRACE_WINDOW,
    TRACE_OF_DISTRIBUTION,
    TRACE_SAMPLING_RANDOM,
    TRACE_SAMPLING_WINDOW,
    UNIFORM,
    WorkloadSpec,
    stream_rng,
)
from pytest_afd.workloads.traces import Trace, load_trace


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
    rng = stream_rng(spec.seed, STREAM_LENGTHS)
    replace = spec.num_requests > len(trace)
    return rng.choice(len(trace), size=spec.num_requests, replace=replace)


def _trace_window(spec: WorkloadSpec, trace: Trace) -> np.ndarray:
    if spec.num_requests > len(trace):
        raise ValueError(
            f"num_requests={spec.num_requests} exceeds the {trace.name!r} trace's "
            f"{len(trace)} requests; use trace_sampling={TRACE_SAMPLING_RANDOM!r}"
        )
    start = int(
        stream_rng(spec.seed, STREAM_TRACE_WINDOW).integers(0, len(trace) - spec.num_requests + 1)
    )
    return np.arange(start, start + spec.num_requests)


def shape_lengths(spec: WorkloadSpec) -> np.ndarray:
    """Unnormalised prompt lengths (float, logical tokens) in generation order."""
    n = spec.num_requests
    rng = stream_rng(spec.seed, STREAM_LENGTHS)
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
    trace = load_trace(TRACE_OF_DISTRIBUTION[spec.distribution])
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


def scaled_total(spec: WorkloadSpec, shape: np.ndarray) -> int:
    """Total prompt tokens after normalising to the logical target and scaling (>= 1 per prompt)."""
    logical_total = (
        spec.target_total_tokens
        if spec.target_total_tokens is not None
        else int(np.round(shape).clip(min=1).sum())
    )
    return max(spec.num_requests, round(logical_total * spec.scale))


def fitted_prefixes(spec: WorkloadSpec, lengths: np.ndarray) -> tuple[int, np.ndarray]:
    """(shared prefix P, per-prompt prefix tokens) inside the hit-0 lengths.

    Every prompt keeps the length its hit-0 twin has; only how much of it is
    the shared prefix varies: prompt i starts with the first ``p_i`` tokens of
    one P-token prefix, ``p_i`` = P or, for a prompt too short for it, its
    longest whole-block prefix that leaves one token to compute. P (whole
    blocks) is chosen so sum(p_i) / total is closest to the requested ratio;
    a ratio the lengths cannot reach gets the closest one (recorded as the
    designed ratio).
    """
    zero = np.zeros(lengths.size, dtype=np.int64)
    if spec.requested_hit_ratio == 0:
        return 0, zero
    block = spec.block_size
    room = (lengths - 1) // block * block  # the most prefix each prompt can hold
    if int(room.max()) == 0:
        raise ValueError(
            f"requested_hit_ratio={spec.requested_hit_ratio}: no prompt is longer than one "
            f"block (block_size={block}, longest {int(lengths.max())} tokens); raise scale or "
            "target_total_tokens, or lower block_size"
        )
    total = int(lengths.sum())
    best_prefix, best_gap = block, None
    for prefix in range(block, int(room.max()) + 1, block):
        gap = abs(np.minimum(room, prefix).sum() / total - spec.requested_hit_ratio)
        if best_gap is None or gap < best_gap:
            best_prefix, best_gap = prefix, gap
    return best_prefix, np.minimum(room, best_prefix).astype(np.int64)


# --- arrivals -------------------------------------------------------------------
def arrival_times(spec: WorkloadSpec) -> np.ndarray:
    n = spec.num_requests
    if spec.arrival == ARRIVAL_ALL_AT_ONCE:
        return np.zeros(n)
    if spec.arrival == ARRIVAL_POISSON:
        assert spec.arrival_rate is not None  # checked by the spec
        gaps = stream_rng(spec.seed, STREAM_ARRIVAL).exponential(1.0 / spec.arrival_rate, size=n)
        gaps[0] = 0.0
        return np.cumsum(gaps)
    trace_name = TRACE_OF_DISTRIBUTION.get(spec.distribution, spec.arrival_trace)
    trace = load_trace(trace_name)
    rows = _trace_window(spec, trace)
    stamps = trace.arrival_s[rows]
    return stamps - stamps[0]
