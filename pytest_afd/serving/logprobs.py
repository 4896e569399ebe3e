"""Top-k logprobs in the shape of vLLM's OpenAI-compatible ``/v1/completions`` API.

A backend behind HTTP returns no logits; it returns, for the generated token,
the ``k`` most likely tokens and their logprobs. Field names follow vLLM's
``vllm/entrypoints/openai/completion/protocol.py`` (revision in docs/ascend.md):
the request carries ``logprobs: k`` (and ``return_tokens_as_token_ids: true``
so tokens come back as ``"token_id:<id>"`` instead of text), the choice carries
``logprobs: {tokens, token_logprobs, top_logprobs, text_offset}``, one entry
per generated token, ``top_logprobs`` being ``{token: logprob}``.

This module builds that object from logits (the CPU HTTP server) and parses it
back (the client), so both sides of the wire share one definition.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

TOKEN_ID_PREFIX = "token_id:"
# Logprobs the gates ask for: the top-k of golden.TOPK_LOGPROB_K, so the
# topk_logprob profile sees each side's whole top-k.
DEFAULT_NUM_LOGPROBS = 5
# vLLM caps logprobs at --max-logprobs (default 20); asking for more is a 400.
MAX_NUM_LOGPROBS = 20


class LogprobsFormatError(ValueError):
    """A ``logprobs`` object outside the API contract (names the offending field)."""


def token_label(token_id: int) -> str:
    """vLLM's spelling of a token under ``return_tokens_as_token_ids``."""
    return f"{TOKEN_ID_PREFIX}{token_id}"


def parse_token_label(label: str) -> int:
    if not isinstance(label, str) or not label.startswith(TOKEN_ID_PREFIX):
        raise LogprobsFormatError(
            f"top_logprobs key {label!r} is not '{TOKEN_ID_PREFIX}<id>'; the request must set "
            "return_tokens_as_token_ids=true"
        )
    return int(label[len(TOKEN_ID_PREFIX):])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    values = np.asarray(logits, dtype=np.float64)
    shifted = values - values.max()
    return shifted - np.log(np.exp(shifted).sum())


def top_logprobs_from_logits(logits: np.ndarray, k: int) -> dict[int, float]:
    """The ``k`` most likely tokens (ties: lower id first) and their logprobs."""
    logprobs = log_softmax(logits)
    order = np.argsort(-logprobs, kind="stable")[:k]
    return {int(token): float(logprobs[token]) for token in order}


def completion_logprobs(logits: np.ndarray, sampled: int, k: int) -> dict[str, Any]:
    """The choice's ``logprobs`` object for one generated token (vLLM's CompletionLogProbs)."""
    logprobs = log_softmax(logits)
    top = top_logprobs_from_logits(logits, k)
    return {
        "text_offset": [0],
        "token_logprobs": [float(logprobs[sampled])],
        "tokens": [token_label(sampled)],
        "top_logprobs": [{token_label(token): value for token, value in top.items()}],
    }


def parse_first_top_logprobs(logprobs: Mapping[str, Any] | None) -> dict[int, float] | None:
    """Token id -> logprob of the first generated token, from a choice's ``logprobs``."""
    if logprobs is None:
        return None
    top = logprobs.get("top_logprobs")
    if not isinstance(top, list) or not top or not isinstance(top[0], Mapping):
        raise LogprobsFormatError(f"logprobs.top_logprobs must be a non-empty list of objects, "
                                  f"got {str(top)[:120]!r}")
    return {parse_token_label(label): float(value) for label, value in top[0].items()}


def dense_rows(rows: list[Mapping[int, float]], other: list[Mapping[int, float]]
               ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Two [R, V] matrices over the union V of both sides' token ids (absent: -inf).

    A token outside a side's top-k has an unknown logprob below every listed
    one, so -inf keeps each side's own top-k order and never makes it a top-k
    member of that side: what the ``topk_logprob`` profile compares.
    """
    if len(rows) != len(other):
        raise ValueError(f"{len(rows)} rows vs {len(other)} rows")
    vocab = sorted({token for row in (*rows, *other) for token in row})
    column = {token: index for index, token in enumerate(vocab)}

    def fill(side: list[Mapping[int, float]]) -> np.ndarray:
        matrix = np.full((len(side), len(vocab)), -np.inf)
        for index, row in enumerate(side):
            for token, value in row.items():
                matrix[index, column[token]] = value
        return matrix

    return fill(rows), fill(other), vocab


def shared_logprob_error(rows: list[Mapping[int, float]], other: list[Mapping[int, float]]
                         ) -> float | None:
    """Largest |logprob difference| over tokens both sides list (evidence, not the verdict)."""
    errors = [abs(a[token] - b[token]) for a, b in zip(rows, other, strict=True)
              for token in a.keys() & b.keys()]
    return max(errors) if errors else None
