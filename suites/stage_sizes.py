"""Stage sizes: the RFC's logical sizes (8 requests, 65,536 prompt tokens, 128-token
KV blocks, 140,000 max batched tokens) times the stage scale (``--afd-stage-scale``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import pytest

# --- the RFC's logical sizes (recipe values), scaled per backend ---------------
LOGICAL_NUM_REQUESTS = 8  # the recipe's --max-num-seqs
LOGICAL_TOTAL_TOKENS = 65_536  # same total for every distribution (Stage C)
RECIPE_BLOCK_SIZE = 128
RECIPE_MAX_BATCHED_TOKENS = 140_000
# Token ids below this exist in every tokenizer the suites meet (CPU model: 2048).
WORKLOAD_VOCAB_SIZE = 1024
STAGE_SCALE_ENV = "AFD_STAGE_SCALE"
STAGE_SCALE_OPTION = "--afd-stage-scale"
# Backends that need scaled-down stages to run in minutes; the rest run at 1.
DEFAULT_STAGE_SCALES = MappingProxyType({"cpu": 1 / 64})
FULL_SCALE = 1.0


def parse_scale(text: str, source: str) -> float:
    """A positive factor, given as a float or a fraction like ``1/64``."""
    try:
        numerator, _, denominator = text.partition("/")
        value = float(numerator) / float(denominator) if denominator else float(numerator)
    except (ValueError, ZeroDivisionError):
        raise pytest.UsageError(f"{source}={text!r}: expected a number like 0.5 or 1/64") from None
    if not (math.isfinite(value) and 0 < value <= FULL_SCALE):
        raise pytest.UsageError(f"{source}={text!r}: expected a factor in (0, 1]")
    return value


def stage_scale(config: pytest.Config, backend_name: str) -> float:
    given = config.getoption("afd_stage_scale", default=None)
    if given is not None:
        return parse_scale(given, STAGE_SCALE_OPTION)
    if os.environ.get(STAGE_SCALE_ENV):
        return parse_scale(os.environ[STAGE_SCALE_ENV], f"${STAGE_SCALE_ENV}")
    return DEFAULT_STAGE_SCALES.get(backend_name, FULL_SCALE)


def power_of_two_at_most(value: float) -> int:
    """The largest power of two <= value (at least 1): block sizes must be powers of two."""
    return 1 << max(0, math.floor(math.log2(max(value, 1.0))))


@dataclass(frozen=True)
class StageSizes:
    """The logical recipe sizes times the stage scale."""

    scale: float

    @property
    def block_size(self) -> int:
        return power_of_two_at_most(RECIPE_BLOCK_SIZE * self.scale)

    @property
    def max_batched_tokens(self) -> int:
        return max(self.block_size, round(RECIPE_MAX_BATCHED_TOKENS * self.scale))

    def tokens(self, logical: int) -> int:
        """A logical token count (a chunk size, a budget) at this scale, >= one block."""
        return max(self.block_size, round(logical * self.scale))

    def to_json(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "block_size": self.block_size,
            "max_batched_tokens": self.max_batched_tokens,
            "logical_total_tokens": LOGICAL_TOTAL_TOKENS,
            "num_requests": LOGICAL_NUM_REQUESTS,
        }
