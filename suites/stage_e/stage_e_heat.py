"""Stage E: per-layer expert heat and EP-rank skew from routed-token counts."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def max_over_mean(counts: Sequence[int]) -> float | None:
    """Hottest entry / mean (1.0 = perfectly balanced); None for a layer that routed nothing."""
    values = np.asarray(counts, dtype=np.float64)
    mean = float(values.mean()) if values.size else 0.0
    return None if mean <= 0 else float(values.max() / mean)


def heat_summary(per_expert: Sequence[Sequence[int]], per_rank: Sequence[Sequence[int]]) -> dict:
    """Per MoE layer: expert heat and rank skew (max/mean), and the worst layer of each."""
    expert = [max_over_mean(layer) for layer in per_expert]
    rank = [max_over_mean(layer) for layer in per_rank]
    return {
        "per_layer_expert_max_over_mean": expert,
        "per_layer_rank_max_over_mean": rank,
        "worst_expert_max_over_mean": max((v for v in expert if v is not None), default=None),
        "worst_rank_max_over_mean": max((v for v in rank if v is not None), default=None),
    }
