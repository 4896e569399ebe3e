"""The issue-2 motivation: request-boundary imbalance on real traffic (the shipped traces)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pytest_afd.workloads.spec import DEFAULT_NUM_REQUESTS
from pytest_afd.workloads.traces import load_trace

P90 = 90


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
