"""Prompt-length statistics the RFC asks every dataset to record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class LengthStats:
    """Prompt-length statistics the RFC asks every dataset to record."""

    count: int
    total: int
    mean: float
    std: float  # sample standard deviation (n - 1), as pytest_afd.stats.repetitions.summarize; 0 for one prompt
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
