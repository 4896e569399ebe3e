"""``afd-chunk-plan``'s arguments: types that name the bad value, and the input bounds.

Planning time grows with the number of forwards, so inputs are bounded here
(exit 2 before any planning); see ``docs/chunk-planner.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_afd.scheduling.model import (
    DEFAULT_MAX_BATCHED_TOKENS,
    DEFAULT_MAX_PREFILL_REQS,
    DEFAULT_PAGE_SIZE,
    DEFAULT_ROUND_CAPACITY,
)
from pytest_afd.topology import MAX_TOTAL_RANKS

PROG = "afd-chunk-plan"
UNCHUNKED = "unchunked"
# "8k" / "8K" in a chunk size means 8 * 1024 tokens (the RFC's "8K tokens").
KILO_SUFFIX_TOKENS = 1024
DEFAULT_SHOW_FORWARDS = 8
# Input bounds (docs/chunk-planner.md): planning time grows with the number of
# forwards, so a typo such as --prompt-len 99999999999999 is refused at once
# instead of running for minutes. 2**20 tokens is 8x DeepSeek V3.2's 128K
# context; 2**17 forwards plan in a few seconds on one core.
MAX_PROMPT_LEN = 2**20
MAX_NUM_REQUESTS = 2**17
MAX_FORWARDS = 2**17
# Parallel sizes: a topology has at most this many ranks (pytest_afd.topology).
MAX_PARALLEL_SIZE = MAX_TOTAL_RANKS
# Longer digit strings are refused before int() (which gives up past 4,300 digits).
MAX_INT_DIGITS = 20


# ---------------------------------------------------------------------------
# Argument types: each names the bad value


def _int_at_least(text: str, minimum: int, requirement: str, maximum: int | None = None) -> int:
    cleaned = text.strip()
    if len(cleaned) > MAX_INT_DIGITS or not cleaned.isascii():
        shown = cleaned if len(cleaned) <= MAX_INT_DIGITS else f"{cleaned[:MAX_INT_DIGITS]}..."
        raise argparse.ArgumentTypeError(
            f"{shown!r} is not an integer of at most {MAX_INT_DIGITS} ASCII digits"
        )
    try:
        value = int(cleaned)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} must be {requirement}")
    if maximum is not None and value > maximum:
        raise argparse.ArgumentTypeError(f"{text!r} is more than the limit {maximum}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0, ">= 0")


def prompt_length(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer", MAX_PROMPT_LEN)


def request_count(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer", MAX_NUM_REQUESTS)


def parallel_size(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer", MAX_PARALLEL_SIZE)


def chunk_value(text: str) -> int | None:
    """A chunk size: a positive token count (``8192`` or ``8k``) or ``unchunked``."""
    cleaned = text.strip()
    if cleaned.lower() == UNCHUNKED:
        return None
    multiplier = 1
    if cleaned[-1:] in ("k", "K"):
        cleaned, multiplier = cleaned[:-1], KILO_SUFFIX_TOKENS
    try:
        if len(cleaned) > MAX_INT_DIGITS or not cleaned.isascii():
            raise ValueError(cleaned)
        value = int(cleaned) * multiplier
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"chunk {text!r}: expected a positive token count or {UNCHUNKED!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"chunk {text!r}: expected a positive token count or {UNCHUNKED!r}"
        )
    return value


def chunk_list(text: str) -> list[int | None]:
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"sweep {text!r}: expected a comma-separated list")
    return [chunk_value(item) for item in items]


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Model how a prefill chunk size is interpreted (DP folding, page-granular "
            "admission, CP zigzag rows, communication rounds) and print the batch shapes."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--prompt-len",
        type=prompt_length,
        action="append",
        metavar="N",
        help=f"a prompt length in tokens, at most {MAX_PROMPT_LEN} (repeatable)",
    )
    source.add_argument(
        "--workload",
        type=Path,
        metavar="FILE",
        help='JSONL (an integer or {"prompt_len": N, "cached_prefix": M} '
        "per line) or an Azure trace CSV (column ContextTokens)",
    )
    parser.add_argument(
        "--num-requests",
        type=request_count,
        metavar="N",
        help=f"the first N lengths, cycling through them if there are fewer (at most {MAX_NUM_REQUESTS})",
    )
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument(
        "--chunk",
        type=chunk_value,
        metavar="N|unchunked",
        help="the GLOBAL chunk flag (divided by --dp)",
    )
    size.add_argument(
        "--sweep",
        type=chunk_list,
        metavar="LIST",
        help="comma-separated chunk sizes, e.g. 8192,16384,32768,65536,unchunked",
    )
    parser.add_argument("--dp", type=parallel_size, metavar="N", help="DP size (default 1)")
    parser.add_argument(
        "--cp", type=parallel_size, default=1, metavar="N", help="prefill context-parallel size"
    )
    parser.add_argument(
        "--ranks",
        type=parallel_size,
        metavar="N",
        help="attention ranks (dp * cp); checked, and gives --dp when omitted",
    )
    parser.add_argument("--page-size", type=prompt_length, default=DEFAULT_PAGE_SIZE, metavar="N",
                        help="KV cache page (block) size in tokens (default: %(default)s)")
    parser.add_argument(
        "--max-prefill-reqs",
        type=positive_int,
        default=DEFAULT_MAX_PREFILL_REQS,
        metavar="N",
        help="request slots per batch (Pcap)",
    )
    parser.add_argument(
        "--max-running-seqs",
        type=positive_int,
        metavar="N",
        help="max running sequences (vLLM max_num_seqs)",
    )
    parser.add_argument(
        "--max-batched-tokens", type=positive_int, default=DEFAULT_MAX_BATCHED_TOKENS, metavar="N",
        help="scheduler token budget per forward (default: %(default)s)",
    )
    parser.add_argument(
        "--round-capacity",
        type=positive_int,
        default=DEFAULT_ROUND_CAPACITY,
        metavar="N",
        help="rows per rank one dispatch/combine round moves",
    )
    parser.add_argument(
        "--cached-prefix",
        type=nonnegative_int,
        metavar="N",
        help="requested cached prefix per request; realized as whole pages",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--show-forwards",
        type=nonnegative_int,
        default=DEFAULT_SHOW_FORWARDS,
        metavar="K",
        help="forwards listed in the table",
    )
    return parser
