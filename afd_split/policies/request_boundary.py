"""The current AFD behaviour, kept as the Stage A control: cut only between requests."""

from __future__ import annotations

import numpy as np

from afd_split.constraints import SplitConstraints
from afd_split.errors import SplitRejectedError

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
    num_tokens = int(cu_tokens[-1])
    min_tokens = constraints.min_ubatch_tokens
    # Interior boundaries are cu_tokens[0 .. R-2]; boundary k puts k + 1 requests in the head.
    interior = cu_tokens[:-1]
    # Integer cu values: ">= x" is searchsorted(x, "left"), "<= y" is searchsorted(y + 1) - 1.
    first_ok, upper, past_last_ok = interior.searchsorted(
        (min_tokens, (num_tokens + 1) // 2, num_tokens - min_tokens + 1)
    ).tolist()
    last_ok = past_last_ok - 1
    if first_ok > last_ok:
        raise SplitRejectedError(
            f"request_boundary: no request boundary leaves min_ubatch_tokens={min_tokens} "
            f"in both ubatches of a {num_tokens}-token batch"
        )
    best_key = None
    best_cut = 0
    for boundary in {min(max(upper - 1, first_ok), last_ok), min(max(upper, first_ok), last_ok)}:
        cut = int(interior[boundary])
        head_requests = boundary + 1
        key = (abs(2 * cut - num_tokens), abs(2 * head_requests - num_requests), head_requests)
        if best_key is None or key < best_key:
            best_key, best_cut = key, cut
    return best_cut
