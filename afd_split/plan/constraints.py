"""Split policies and the constraints a split must honour."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from enum import Enum

MIN_PCP_FOR_ZIGZAG = 2
"""PCP sizes below this mean "no prefill context parallelism" (no zigzag padding)."""

ZIGZAG_CHUNKS_PER_RANK = 2
"""DualChunkSwap gives each PCP rank two chunks, so request rows pad to 2 * pcp."""


class SplitPolicy(str, Enum):
    """How the scheduled token interval [0, T) is cut into ubatches."""

    NONE = "none"
    REQUEST_BOUNDARY = "request_boundary"
    TOKEN_BALANCED = "token_balanced"
    COST_BALANCED = "cost_balanced"  # modelled two-stage critical path (afd_split.plan.cost)


def checked_int(where: str, value, minimum: int) -> int:
    """``value`` as a plain int >= ``minimum``; numpy integers are accepted, bools and
    floats refused, and the error names ``where`` the value was given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"{where} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})"
        )
    value = int(value)
    if value < minimum:
        raise ValueError(f"{where} must be an integer >= {minimum}, got {value}")
    return value


def round_up(value: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``value``."""
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class SplitConstraints:
    """Layout rules a plan must obey; validated on construction so bad values fail early.

    align: SP/TP unit: the cut is a multiple of it and every ubatch's rows are too.
    padded_total: rows after DP / graph padding; the extra rows go to the LAST ubatch.
    min_ubatch_tokens: real tokens every ubatch must carry.
    pcp_size: prefill context parallel size; > 1 pads each request piece inside each
        ubatch to a multiple of 2 * pcp_size after the split.
    """

    align: int = 1
    padded_total: int | None = None
    min_ubatch_tokens: int = 1
    pcp_size: int = 1

    def __post_init__(self) -> None:
        for name in ("align", "min_ubatch_tokens", "pcp_size"):
            value = checked_int(f"SplitConstraints.{name}", getattr(self, name), 1)
            object.__setattr__(self, name, value)
        if self.padded_total is not None:
            total = checked_int("SplitConstraints.padded_total", self.padded_total, 1)
            object.__setattr__(self, "padded_total", total)
            if total % self.align:
                raise ValueError(
                    f"SplitConstraints.padded_total={total} is not a multiple of align={self.align}"
                )

    @property
    def pcp_row_multiple(self) -> int:
        """Rows each request piece pads to under PCP (1 when PCP is off)."""
        if self.pcp_size < MIN_PCP_FOR_ZIGZAG:
            return 1
        return ZIGZAG_CHUNKS_PER_RANK * self.pcp_size

    def total_rows_for(self, num_tokens: int) -> int:
        """Rows of the whole batch without PCP: padded_total, or T rounded up to align."""
        minimum = round_up(num_tokens, self.align)
        if self.padded_total is None:
            return minimum
        if self.padded_total < minimum:
            raise ValueError(
                f"SplitConstraints.padded_total={self.padded_total} is below "
                f"round_up(T={num_tokens}, align={self.align})={minimum}"
            )
        return self.padded_total

    def to_dict(self) -> dict:
        """JSON-able form for evidence and fingerprints."""
        return {
            "align": self.align,
            "padded_total": self.padded_total,
            "min_ubatch_tokens": self.min_ubatch_tokens,
            "pcp_size": self.pcp_size,
        }
