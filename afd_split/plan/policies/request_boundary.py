"""The current AFD behaviour, kept as the Stage A control: cut only between requests."""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from afd_split.errors import SplitRejectedError
from afd_split.plan.constraints import SplitConstraints

MIN_REQUESTS_FOR_BOUNDARY_SPLIT = 2


def select_request_boundary_cut(
    scheduled_tokens: np.ndarray,
    cu_tokens: np.ndarray,
    constraints: SplitConstraints,
    num_computed_tokens: np.ndarray | None,
) -> int:
    """Best boundary by |2·cu - T|, tie-broken by request-count balance, then fewer head requests.

    ``cu_tokens`` is strictly increasing (every request has >= 1 token), so the
    candidates are the (at most two) boundaries around T/2 after clamping to the
    boundaries that leave ``min_ubatch_tokens`` on each side: one binary search,
    not a scan.
    """
    num_requests = len(cu_tokens)
    if num_requests < MIN_REQUESTS_FOR_BOUNDARY_SPLIT:
        raise SplitRejectedError(
            f"request_boundary: a batch of {num_requests} request(s) has no interior boundary"
        )
    num_tokens = cu_tokens.item(-1)
    min_tokens = constraints.min_ubatch_tokens
    # Interior boundaries are cu_tokens[0 .. R-2]; boundary k puts k + 1 requests in the head.
    interior = cu_tokens[:-1]
    last = num_requests - 2
    # Integer cu values: ">= x" is searchsorted(x), "<= y" is searchsorted(y + 1) - 1; the
    # common min_ubatch_tokens that every boundary satisfies skips both searches.
    first_ok = 0 if interior.item(0) >= min_tokens else int(interior.searchsorted(min_tokens))
    last_ok = (
        last
        if num_tokens - interior.item(last) >= min_tokens
        else int(interior.searchsorted(num_tokens - min_tokens + 1)) - 1
    )
    upper = int(interior.searchsorted((num_tokens + 1) // 2))
    return _best_of_two(cu_tokens, num_tokens, num_requests, first_ok, last_ok, upper, min_tokens)


def request_boundary_cut(cu_tokens: list[int], constraints: SplitConstraints) -> int:
    """``select_request_boundary_cut`` on a list of prefix sums (the scalar planner's): the
    same clamped candidates, found with ``bisect`` instead of ``searchsorted``."""
    num_requests = len(cu_tokens)
    if num_requests < MIN_REQUESTS_FOR_BOUNDARY_SPLIT:
        raise SplitRejectedError(
            f"request_boundary: a batch of {num_requests} request(s) has no interior boundary"
        )
    num_tokens = cu_tokens[-1]
    min_tokens = constraints.min_ubatch_tokens
    last = num_requests - 2
    interior_end = num_requests - 1  # bisect over cu_tokens[0 .. R-2]
    first_ok = (
        0 if cu_tokens[0] >= min_tokens else bisect_left(cu_tokens, min_tokens, 0, interior_end)
    )
    last_ok = (
        last
        if num_tokens - cu_tokens[last] >= min_tokens
        else bisect_left(cu_tokens, num_tokens - min_tokens + 1, 0, interior_end) - 1
    )
    upper = bisect_left(cu_tokens, (num_tokens + 1) // 2, 0, interior_end)
    return _best_of_two(cu_tokens, num_tokens, num_requests, first_ok, last_ok, upper, min_tokens)


def _best_of_two(cu_tokens, num_tokens, num_requests, first_ok, last_ok, upper, min_tokens):
    """Of the eligible boundaries just below and above T/2, the one the policy's key prefers."""
    if first_ok > last_ok:
        raise SplitRejectedError(
            f"request_boundary: no request boundary leaves min_ubatch_tokens={min_tokens} "
            f"in both ubatches of a {num_tokens}-token batch"
        )
    below = min(max(upper - 1, first_ok), last_ok)
    above = min(max(upper, first_ok), last_ok)
    cut_below, cut_above = int(cu_tokens[below]), int(cu_tokens[above])
    key_below = (abs(2 * cut_below - num_tokens), abs(2 * below + 2 - num_requests), below)
    key_above = (abs(2 * cut_above - num_tokens), abs(2 * above + 2 - num_requests), above)
    return cut_below if key_below <= key_above else cut_above
