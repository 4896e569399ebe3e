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

Modules by job: :mod:`.spec` (names and the spec), :mod:`.traces` (the shipped
traces), :mod:`.stats` (length statistics), :mod:`.shapes` (lengths, scaling,
arrivals), :mod:`.build` (the built workload), :mod:`.imbalance` (the issue-2
request-boundary imbalance). This module re-exports their public names.
"""

from pytest_afd.workloads.build import (
    Workload,
    build_workload,
    make_workload,
    prefix_cache_workloads,
    workload_from_json,
    workload_matrix,
)
from pytest_afd.workloads.imbalance import (
    P90,
    BoundaryImbalance,
    best_boundary_imbalance,
    request_boundary_imbalance,
    trace_boundary_imbalance,
)
from pytest_afd.workloads.shapes import (
    apportion,
)
from pytest_afd.workloads.spec import (
    ADVERSARIAL,
    ARRIVAL_ALL_AT_ONCE,
    ARRIVAL_POISSON,
    ARRIVAL_PROCESSES,
    ARRIVAL_TRACE,
    BIMODAL,
    BIMODAL_LONG_FRACTION,
    BIMODAL_LONG_TOKENS,
    BIMODAL_SHORT_TOKENS,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MEAN_PROMPT_TOKENS,
    DEFAULT_NUM_REQUESTS,
    DEFAULT_VOCAB_SIZE,
    DISTRIBUTIONS,
    HEAVY_TAIL_ALPHA,
    HEAVY_TAIL_MIN_TOKENS,
    HEAVY_TAILED,
    LONG_SHORT,
    LONG_SHORT_LONG_TOKENS,
    LONG_SHORT_SHORT_TOKENS,
    MAX_CONTEXT_TOKENS,
    NARROW,
    NARROW_CV,
    ORDER_FIXED,
    ORDER_SHUFFLED,
    ORDERS,
    STAGE_B_HIT_RATIOS,
    TOKEN_GENERATOR_VERSION,
    TRACE_CODE,
    TRACE_CONV,
    TRACE_NAMES,
    TRACE_SAMPLING_RANDOM,
    TRACE_SAMPLING_WINDOW,
    TRACE_SAMPLINGS,
    UNIFORM,
    WorkloadSpec,
)
from pytest_afd.workloads.stats import (
    PERCENTILES,
    LengthStats,
    length_stats,
)
from pytest_afd.workloads.traces import (
    Trace,
    load_trace,
)

__all__ = [
    "ADVERSARIAL",
    "ARRIVAL_ALL_AT_ONCE",
    "ARRIVAL_POISSON",
    "ARRIVAL_PROCESSES",
    "ARRIVAL_TRACE",
    "BIMODAL",
    "BIMODAL_LONG_FRACTION",
    "BIMODAL_LONG_TOKENS",
    "BIMODAL_SHORT_TOKENS",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MEAN_PROMPT_TOKENS",
    "DEFAULT_NUM_REQUESTS",
    "DEFAULT_VOCAB_SIZE",
    "DISTRIBUTIONS",
    "HEAVY_TAILED",
    "HEAVY_TAIL_ALPHA",
    "HEAVY_TAIL_MIN_TOKENS",
    "LONG_SHORT",
    "LONG_SHORT_LONG_TOKENS",
    "LONG_SHORT_SHORT_TOKENS",
    "MAX_CONTEXT_TOKENS",
    "NARROW",
    "NARROW_CV",
    "ORDERS",
    "ORDER_FIXED",
    "ORDER_SHUFFLED",
    "P90",
    "PERCENTILES",
    "STAGE_B_HIT_RATIOS",
    "TOKEN_GENERATOR_VERSION",
    "TRACE_CODE",
    "TRACE_CONV",
    "TRACE_NAMES",
    "TRACE_SAMPLINGS",
    "TRACE_SAMPLING_RANDOM",
    "TRACE_SAMPLING_WINDOW",
    "UNIFORM",
    "BoundaryImbalance",
    "LengthStats",
    "Trace",
    "Workload",
    "WorkloadSpec",
    "apportion",
    "best_boundary_imbalance",
    "build_workload",
    "length_stats",
    "load_trace",
    "make_workload",
    "prefix_cache_workloads",
    "request_boundary_imbalance",
    "trace_boundary_imbalance",
    "workload_from_json",
    "workload_matrix",
]
