"""Full-block prefix-cache matching, as vLLM's block hashing does it.

A prompt's KV is cached per FULL block; block ``k``'s key chains the key of
block ``k - 1`` with its own token ids, so a hit means the whole prefix up to
that block matches. A lookup counts only whole matching blocks and is capped
so at least one token is computed (the last token's logits are needed).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

# 16-byte blake2b keys: collisions are negligible and keys stay small.
_BLOCK_KEY_BYTES = 16
_ROOT_KEY = b"\x00" * _BLOCK_KEY_BYTES
_TOKEN_DTYPE = np.int64


def block_keys(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Chained keys of every FULL block of ``token_ids`` (a partial last block has none)."""
    tokens = np.asarray(token_ids, dtype=_TOKEN_DTYPE)
    keys: list[bytes] = []
    parent = _ROOT_KEY
    for start in range(0, len(tokens) - block_size + 1, block_size):
        digest = hashlib.blake2b(parent, digest_size=_BLOCK_KEY_BYTES)
        digest.update(tokens[start : start + block_size].tobytes())
        parent = digest.digest()
        keys.append(parent)
    return keys


def max_cacheable_tokens(prompt_len: int, block_size: int) -> int:
    """The largest hit a prompt can realize: whole blocks, leaving >= 1 token to compute."""
    return ((prompt_len - 1) // block_size) * block_size


def realized_cached_tokens(prompt_len: int, requested: int, block_size: int) -> int:
    """What a full-block cache realizes when the first ``requested`` tokens are cached.

    Used to predict hits (e.g. ``afd-chunk-plan --cached-prefix``); measured runs
    take the realized count from the runtime instead.
    """
    if requested < 0 or requested > prompt_len:
        raise ValueError(
            f"cached prefix {requested} for a {prompt_len}-token prompt; "
            f"expected 0 <= prefix <= prompt length"
        )
    whole_blocks = (requested // block_size) * block_size
    return min(whole_blocks, max_cacheable_tokens(prompt_len, block_size))


class PrefixCacheIndex:
    """Which full blocks are cached; lookups return realized hit tokens.

    Without eviction (a harness run fits its cache); ``clear()`` starts a cold phase.
    """

    def __init__(self, block_size: int) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size={block_size!r}; expected a positive integer")
        self.block_size = block_size
        self._keys: set[bytes] = set()

    def __len__(self) -> int:
        """Cached blocks."""
        return len(self._keys)

    def lookup(self, token_ids: Sequence[int]) -> int:
        """Cached tokens for this prompt: leading whole matching blocks, >= 1 token left."""
        limit = max_cacheable_tokens(len(token_ids), self.block_size) // self.block_size
        hits = 0
        for key in block_keys(token_ids, self.block_size)[:limit]:
            if key not in self._keys:
                break
            hits += 1
        return hits * self.block_size

    def insert(self, token_ids: Sequence[int]) -> None:
        """Cache every full block of a prefilled prompt."""
        self._keys.update(block_keys(token_ids, self.block_size))

    def clear(self) -> None:
        self._keys.clear()

    def lookup_and_insert(self, prompts: Sequence[Sequence[int]]) -> list[int]:
        """Realized hits for a queue processed in order (each prompt sees earlier ones).

        A cold phase starts from ``clear()``; a warm phase replays the queue after it.
        """
        hits = []
        for token_ids in prompts:
            hits.append(self.lookup(token_ids))
            self.insert(token_ids)
        return hits
