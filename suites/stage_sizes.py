"""Stage sizes: the RFC's logical sizes (8 requests, 65,536 prompt tokens, 128-token
KV blocks, 140,000 max batched tokens) times the stage scale (``--afd-stage-scale``, resolved by the plugin into
``afd_options.stage_scale``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# --- the RFC's logical sizes (recipe values), scaled per backend ---------------
LOGICAL_NUM_REQUESTS = 8  # the recipe's --max-num-seqs
LOGICAL_TOTAL_TOKENS = 65_536  # same total for every distribution (Stage C)
RECIPE_BLOCK_SIZE = 128
RECIPE_MAX_BATCHED_TOKENS = 140_000
# Token ids below this exist in every tokenizer the suites meet (CPU model: 2048).
WORKLOAD_VOCAB_SIZE = 1024


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
