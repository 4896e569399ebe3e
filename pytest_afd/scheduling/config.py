"""Scheduler configuration (chunk-semantics layers 1-2 inputs), integer helpers and validity
checks: sizes the stack may accept but that must be reported, not measured."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_PAGE_SIZE = 128
DEFAULT_MAX_PREFILL_REQS = 8
DEFAULT_MAX_BATCHED_TOKENS = 140_000
# DeepEP "normal" mode moves at most this many rows per rank per round.
DEFAULT_ROUND_CAPACITY = 8192
# Zigzag (DualChunkSwap) splits each request into this many chunks per CP rank.


def ceil_div(numerator: int, denominator: int) -> int:
    """Integer ceiling division (no float rounding on large token counts)."""
    return -(-numerator // denominator)


def round_up(value: int, multiple: int) -> int:
    return ceil_div(value, multiple) * multiple


def round_down(value: int, multiple: int) -> int:
    return (value // multiple) * multiple


def require_int(name: str, value: object, minimum: int) -> None:
    # bool is an int subclass; True as a page size is a caller bug, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r}; expected an integer")
    if value < minimum:
        raise ValueError(f"{name}={value!r}; expected an integer >= {minimum}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Everything that decides batch shapes. Field values are the flags as given.

    ``chunk_size`` is the GLOBAL flag (None = chunked prefill disabled). A
    combination the stack would accept but that is invalid for measurement
    (e.g. a chunk that is not a page multiple) is NOT an error here: it makes
    the :class:`SchedulePlan` invalid with a reason. Nonsense (a zero chunk, a
    negative size) raises ``ValueError`` at construction.
    """

    chunk_size: int | None
    dp_size: int = 1
    cp_size: int = 1
    page_size: int = DEFAULT_PAGE_SIZE
    max_prefill_reqs: int = DEFAULT_MAX_PREFILL_REQS
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    round_capacity: int = DEFAULT_ROUND_CAPACITY
    # Max running sequences (vLLM max_num_seqs). Prefill-only requests finish
    # with their final chunk, so this caps requests per batch like Pcap.
    max_running_seqs: int | None = None

    def __post_init__(self) -> None:
        if self.chunk_size is not None:
            require_int("chunk_size", self.chunk_size, 1)
        require_int("dp_size", self.dp_size, 1)
        require_int("cp_size", self.cp_size, 1)
        require_int("page_size", self.page_size, 1)
        require_int("max_prefill_reqs", self.max_prefill_reqs, 1)
        require_int("max_batched_tokens", self.max_batched_tokens, 1)
        require_int("round_capacity", self.round_capacity, 1)
        if self.max_running_seqs is not None:
            require_int("max_running_seqs", self.max_running_seqs, 1)

    @property
    def chunked(self) -> bool:
        return self.chunk_size is not None

    @property
    def effective_chunk(self) -> int | None:
        """The per-DP-group budget: ``chunk_size // dp_size`` (None when unchunked)."""
        if self.chunk_size is None:
            return None
        return self.chunk_size // self.dp_size

    @property
    def token_budget(self) -> int:
        """What one batch may be charged: the effective chunk, or max batched tokens."""
        effective = self.effective_chunk
        return self.max_batched_tokens if effective is None else effective

    @property
    def request_slots(self) -> int:
        """Requests one batch may hold: Pcap, further capped by max running sequences."""
        if self.max_running_seqs is None:
            return self.max_prefill_reqs
        return min(self.max_prefill_reqs, self.max_running_seqs)

    def describe_chunk(self) -> str:
        return "unchunked" if self.chunk_size is None else str(self.chunk_size)

    def to_json(self) -> dict[str, Any]:
        return {
            "chunk_size": self.chunk_size,
            "dp_size": self.dp_size,
            "cp_size": self.cp_size,
            "page_size": self.page_size,
            "max_prefill_reqs": self.max_prefill_reqs,
            "max_batched_tokens": self.max_batched_tokens,
            "round_capacity": self.round_capacity,
            "max_running_seqs": self.max_running_seqs,
        }


def config_reasons(config: SchedulerConfig) -> list[str]:
    """Why a chunk configuration is invalid (empty when it is valid)."""
    if config.chunk_size is None:
        return []
    reasons: list[str] = []
    chunk, dp_size, page = config.chunk_size, config.dp_size, config.page_size
    effective = chunk // dp_size
    if chunk % dp_size:
        reasons.append(
            f"chunk {chunk} cannot be folded evenly by dp {dp_size} "
            f"({chunk} % {dp_size} = {chunk % dp_size}; effective chunk would be {effective})"
        )
    if effective < page:
        reasons.append(
            f"effective chunk {effective} (chunk {chunk} // dp {dp_size}) is smaller than "
            f"one page of {page} tokens: no page-aligned piece fits the budget"
        )
    elif effective % page:
        reasons.append(
            f"effective chunk {effective} (chunk {chunk} // dp {dp_size}) is not a multiple "
            f"of page size {page}: page charging can exceed the budget"
        )
    if effective > config.max_batched_tokens:
        reasons.append(
            f"effective chunk {effective} exceeds max batched tokens {config.max_batched_tokens}"
        )
    return reasons


def unchunked_request_reasons(new_tokens: Sequence[int], config: SchedulerConfig) -> list[str]:
    """Unchunked, a request is scheduled whole: its page-charged length must fit one batch."""
    reasons = []
    for index, tokens in enumerate(new_tokens):
        charged = round_up(tokens, config.page_size)
        if charged > config.max_batched_tokens:
            reasons.append(
                f"unchunked: request {index} needs {charged} tokens of budget ({tokens} "
                f"uncached tokens in whole {config.page_size}-token pages) > max batched "
                f"tokens {config.max_batched_tokens}"
            )
    return reasons
