"""split_bench's baselines: the request-boundary search as the AFD plugin writes it.

``baseline_request_boundary`` is the plain-Python search the issue-17 targets
compare against; ``baseline_planner_with_slices`` adds the two ``UBatchSlice``s
the plugin's ``create_request_boundary_ubatch_slices`` returns (context only);
``baseline_plugin_style_scan`` is today's numpy-prefix + ``min()`` shape.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


def baseline_request_boundary(tokens: list[int], min_tokens: int = 1) -> int | None:
    """Plain-Python scan: the request-boundary policy as the AFD plugin writes it today."""
    total = 0
    for count in tokens:
        if count < 1:
            raise ValueError(f"bad token count {count}")
        total += count
    num_requests = len(tokens)
    best_key = None
    best_cut = None
    cut = 0
    for index in range(num_requests - 1):
        cut += tokens[index]
        if cut < min_tokens or total - cut < min_tokens:
            continue
        head_requests = index + 1
        key = (abs(2 * cut - total), abs(2 * head_requests - num_requests), head_requests)
        if best_key is None or key < best_key:
            best_key, best_cut = key, cut
    return best_cut


@dataclass
class UBatchSlice:
    """The two fields of vLLM's ``vllm.v1.worker.ubatch_utils.UBatchSlice`` (a dataclass)."""

    request_slice: slice
    token_slice: slice


def baseline_planner_with_slices(num_scheduled_tokens: np.ndarray):
    """The plain-Python search plus the plugin's output: None (one request, no boundary) or
    the two ubatch slices, from the int64 array the engine holds."""
    tokens = num_scheduled_tokens.tolist()
    cut = baseline_request_boundary(tokens)
    if cut is None:
        return None
    total = sum(tokens)
    head_requests = list(itertools.accumulate(tokens)).index(cut) + 1
    return [
        UBatchSlice(slice(0, head_requests), slice(0, cut)),
        UBatchSlice(slice(head_requests, len(tokens)), slice(cut, total)),
    ]


def baseline_plugin_style_scan(num_scheduled_tokens: np.ndarray) -> int | None:
    """Today's AFD search shape: numpy prefix sums, Python min() with a per-boundary key."""
    num_requests = len(num_scheduled_tokens)
    if num_requests < 2:
        return None
    prefix = np.zeros(num_requests + 1, dtype=np.int64)
    np.cumsum(num_scheduled_tokens, out=prefix[1:])
    total = int(prefix[-1])
    best = min(
        range(1, num_requests),
        key=lambda boundary: (
            abs(2 * int(prefix[boundary]) - total),
            abs(2 * boundary - num_requests),
        ),
    )
    return int(prefix[best])
