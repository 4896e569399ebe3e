"""The RFC's token-balanced cut: nearest aligned token to T / 2, inside a request if need be."""

from __future__ import annotations

import numpy as np

from afd_split.errors import SplitRejectedError
from afd_split.plan.constraints import SplitConstraints, round_up


def token_balanced_cut_range(
    num_tokens: int, constraints: SplitConstraints, *, policy: str = "token_balanced"
) -> tuple[int, int]:
    """Lowest and highest eligible cut: multiples of align leaving min tokens on each side.

    Raises SplitRejectedError (naming ``policy``) when no such cut exists, so every
    policy that cuts on the aligned grid rejects the same batches the same way.
    """
    align = constraints.align
    if align >= num_tokens:
        raise SplitRejectedError(
            f"{policy}: align={align} is not below the batch's {num_tokens} tokens, "
            "so any aligned cut leaves an empty tail"
        )
    lowest = round_up(constraints.min_ubatch_tokens, align)
    highest = (num_tokens - constraints.min_ubatch_tokens) // align * align
    if lowest > highest:
        raise SplitRejectedError(
            f"{policy}: no multiple of align={align} leaves "
            f"min_ubatch_tokens={constraints.min_ubatch_tokens} real tokens in both ubatches "
            f"of a {num_tokens}-token batch (the tail would be empty or padding-only)"
        )
    return lowest, highest


def select_token_balanced_cut(
    scheduled_tokens: np.ndarray,
    cu_tokens: np.ndarray,
    constraints: SplitConstraints,
    num_computed_tokens: np.ndarray | None,
) -> int:
    """Cut minimising |2s - T| over multiples of align; a tie goes to the LARGER cut.

    Why the larger cut on a tie: the tail carries every padding row and reads the
    head's KV for the boundary request, so it is the one to keep lighter.
    The choice is arithmetic (O(1)); the request layout is derived afterwards.
    """
    return token_balanced_cut(cu_tokens.item(-1), constraints)


def token_balanced_cut(num_tokens: int, constraints: SplitConstraints) -> int:
    """The token-balanced cut of a ``num_tokens`` batch (plain integers; the scalar planner's)."""
    align, min_tokens = constraints.align, constraints.min_ubatch_tokens
    lowest = -(-min_tokens // align) * align
    highest = (num_tokens - min_tokens) // align * align
    if align >= num_tokens or lowest > highest:
        token_balanced_cut_range(num_tokens, constraints)  # raises, naming the reason
    # Nearest multiple of align to T/2, ties upward: floor((T + align) / (2 * align)) * align.
    nearest = (num_tokens + align) // (2 * align) * align
    return min(max(nearest, lowest), highest)
