"""The hook's split threshold: steps of fewer scheduled tokens run unsplit (issue 43).

Why: dual batching a step costs the host a plan, a split of the attention metadata,
its request-level check and the builder-state guard, a few hundred microseconds
whatever the step's size (``benchmarks/engine_path_bench.py`` on the project's 2-core
host at load 1-7: 330-440 us at one request and 374 tokens, 410-550 us at 26,594
tokens), while the
NPU step it overlaps shrinks with its tokens. On the recipe's deployment
(``afd_split.plan.npu_step.RECIPE_NPU_STEP``: 6,688 prefill tokens/s per 910C NPU x 32
NPUs = 214,016 tokens/s, a proportional model with no fixed term) a step of ``T``
tokens takes ``T / 214,016`` s, so a forced-split host cost of ``c`` stays within 1%
of the step only from ``T >= c / 1% x 214,016`` tokens: 550 us -> 11,800 tokens. Below
that the split cannot pay for itself, and the hook leaves the step exactly as
upstream would run it unsplit.

Default ``DEFAULT_SPLIT_MIN_TOKENS = 24,576``: the largest forced-split break-even the
engine-path benchmark measured at load ~1 (796 us at 24 requests and 16,391 tokens on the
vLLM-Ascend v0.26.0rc layout -> a 79.6 ms step -> 17,025 tokens; a record of 2026-12-07
17:51 UTC at load 0.5-1.0; the kept record, 17:55 at load 0.7-1.0, measured at most 512 us
below 30K tokens, so the spread between runs is itself ~1.5x) with ~1.4x headroom for a slower or busier host,
rounded up to a multiple of 8,192 (3 x 2^13): within 1% from there on needs a forced split
of at most 1,148 us. A first default of 16,384 (from 550 us measured at fewer requests)
missed the budget by 7% at 24 requests. The recipe's steps (up to
``--max-num-batched-tokens 140000``) are split from there on. Upstream vLLM's own dual
batch overlap does the same with ``ParallelConfig.dbo_prefill_token_threshold`` (512
tokens, "TODO: tune") and ``dbo_decode_token_threshold`` (32): microbatching when
``num_tokens >= threshold`` (read at vllm-project/vllm 840e7972
``vllm/config/parallel.py`` and 015d6f9d ``vllm/v1/worker/ubatch_utils.py``
``check_ubatch_thresholds``); this threshold has
the same meaning (split when ``T >= AFD_SPLIT_MIN_TOKENS``) and a default derived from
the NPU step model rather than a GPU's.

Set it with ``AFD_SPLIT_MIN_TOKENS`` in the Attention workers' environment; ``0``
splits every step the plan can split (the harness's gates and the CPU stages, which
need tiny batches split, set it so). Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping

SPLIT_MIN_TOKENS_ENV = "AFD_SPLIT_MIN_TOKENS"
"""Attention-worker environment variable: the fewest scheduled tokens a split step has."""

DEFAULT_SPLIT_MIN_TOKENS = 24_576
"""The deployed default (see the module docstring for its derivation)."""

NO_THRESHOLD = 0
"""Split every step the plan can split (gates, CPU stages, tests of tiny batches)."""


def split_min_tokens(environ: Mapping[str, str]) -> int:
    """``AFD_SPLIT_MIN_TOKENS`` from ``environ`` (default ``DEFAULT_SPLIT_MIN_TOKENS``); a
    value that is not a whole number >= 0 is refused naming the variable and the value."""
    raw = environ.get(SPLIT_MIN_TOKENS_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_SPLIT_MIN_TOKENS
    text = raw.strip()
    if not text.isdecimal():
        raise ValueError(f"{SPLIT_MIN_TOKENS_ENV}={raw!r} (environment): expected a whole "
                         f"number of tokens >= 0 (0 splits every step the plan can split)")
    return int(text)


def scheduled_total(num_scheduled_tokens) -> int:
    """The step's scheduled tokens (a numpy array's ``sum``, else Python's)."""
    total = getattr(num_scheduled_tokens, "sum", None)
    return int(total()) if total is not None else int(sum(num_scheduled_tokens))


def below_split_threshold(num_tokens: int, min_split_tokens: int) -> bool:
    """The step runs unsplit: fewer than ``min_split_tokens`` tokens (vLLM's DBO rule:
    split when ``num_tokens >= threshold``)."""
    return num_tokens < min_split_tokens


def below_threshold_reason(num_tokens: int, min_split_tokens: int) -> str:
    """The step line's ``fallback_reason`` for a step left unsplit by the threshold."""
    return (f"below the split threshold: {num_tokens} scheduled tokens < "
            f"{SPLIT_MIN_TOKENS_ENV}={min_split_tokens}; the step runs unsplit because "
            "dual batching costs more host time than 1% of so short an NPU step")
