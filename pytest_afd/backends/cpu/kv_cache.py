"""Paged latent KV cache (MLA) with block reuse for prefix caching.

MLA caches one compressed latent (``kv_lora_rank``) plus the roped shared key
(``qk_rope_head_dim``) per token and layer; V3.2 adds the indexer's key
(``index_head_dim``). Slots are ``block * block_size + offset``, addressed by the
``slot_mapping`` / ``block_table`` of an ``afd_split.checks.metadata.BatchMetadata``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from pytest_afd.backends.cpu.config import ModelConfig
from pytest_afd.scheduling import block_keys

DEFAULT_BLOCK_SIZE = 128
INITIAL_BLOCKS = 64
GROWTH_FACTOR = 2


def validate_block_size(block_size: int) -> int:
    if not isinstance(block_size, int) or block_size <= 0 or block_size & (block_size - 1):
        raise ValueError(f"block_size={block_size!r}; expected a positive power of two")
    return block_size


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class PagedKVCache:
    """Per-layer slot arrays that grow on demand; block ids are handed out by :class:`BlockPool`."""

    def __init__(self, config: ModelConfig, block_size: int = DEFAULT_BLOCK_SIZE,
                 num_blocks: int = INITIAL_BLOCKS) -> None:
        self.config = config
        self.block_size = validate_block_size(block_size)
        self.num_blocks = 0
        width = config.kv_lora_rank + config.qk_rope_head_dim + config.index_head_dim
        self._width = width
        self._layers: list[torch.Tensor] = [
            torch.zeros((0, width)) for _ in range(config.num_hidden_layers)
        ]
        self.ensure_blocks(num_blocks)

    def ensure_blocks(self, num_blocks: int) -> None:
        """Grow every layer's storage to hold at least ``num_blocks`` blocks (contents kept)."""
        if num_blocks <= self.num_blocks:
            return
        new_blocks = max(num_blocks, self.num_blocks * GROWTH_FACTOR)
        extra = (new_blocks - self.num_blocks) * self.block_size
        self._layers = [torch.cat([layer, torch.zeros((extra, self._width))]) for layer in self._layers]
        self.num_blocks = new_blocks

    def write(self, layer: int, slots: torch.Tensor, latent: torch.Tensor, rope_key: torch.Tensor,
              index_key: torch.Tensor) -> None:
        # A slot of -1 (PAD_SLOT_ID) is never written, as the NPU cache write skips it.
        written = slots >= 0
        self._layers[layer][slots[written]] = torch.cat([latent, rope_key, index_key],
                                                        dim=-1)[written]

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(latent, roped key, indexer key) of the given slots."""
        rows = self._layers[layer][slots]
        c = self.config
        return rows.split([c.kv_lora_rank, c.qk_rope_head_dim, c.index_head_dim], dim=-1)

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        for layer in self._layers:
            layer[dst] = layer[src]

    def storage(self, layer: int) -> torch.Tensor:
        """The layer's raw slot array [num_blocks * block_size, width] (for inspection)."""
        return self._layers[layer]

    def nbytes(self) -> int:
        return sum(layer.numel() * layer.element_size() for layer in self._layers)


def context_slots(block_table_row: np.ndarray, num_tokens: int, block_size: int) -> torch.Tensor:
    """Slots of positions ``0..num_tokens-1`` of one request."""
    positions = np.arange(num_tokens)
    return torch.from_numpy(block_table_row[positions // block_size] * block_size + positions % block_size)


@dataclass
class RequestBlocks:
    """The blocks one request holds for a run, and the prefix tokens it reuses."""

    block_ids: list[int]
    num_cached_tokens: int
    shared: int = 0  # leading blocks borrowed from the prefix cache


@dataclass
class BlockPool:
    """Allocates blocks in a :class:`PagedKVCache` and keeps full prompt blocks for reuse.

    Which prefix is a hit (and how many tokens) is decided by the scheduler's
    ``PrefixCacheIndex``; this pool only maps those whole blocks to the physical
    blocks that hold their KV, so a hit reads the KV written by an earlier run.
    """

    cache: PagedKVCache
    _free: list[int] = field(default_factory=list)
    _next_block: int = 0
    _refcount: dict[int, int] = field(default_factory=dict)
    _cached: dict[bytes, int] = field(default_factory=dict)  # prefix key -> block id
    _cached_ids: set[int] = field(default_factory=set)

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    def _take(self) -> int:
        if self._free:
            return self._free.pop()
        block = self._next_block
        self._next_block += 1
        self.cache.ensure_blocks(self._next_block)
        return block

    def _release(self, block: int) -> None:
        self._refcount[block] -= 1
        if self._refcount[block] == 0:
            del self._refcount[block]
            if block not in self._cached_ids:
                self._free.append(block)

    def cached_blocks(self, token_ids: Sequence[int]) -> list[int]:
        """Physical blocks of the longest cached whole-block prefix of ``token_ids``."""
        blocks = []
        for key in block_keys(token_ids, self.block_size):
            if key not in self._cached:
                break
            blocks.append(self._cached[key])
        return blocks

    def allocate(self, token_ids: Sequence[int], num_cached_tokens: int) -> RequestBlocks:
        """Blocks for a whole prompt whose first ``num_cached_tokens`` come from the cache.

        Whole cached blocks are shared; a partially reused block is copied into a
        fresh one first, so the request's own writes never touch a shared block.
        """
        bs = self.block_size
        available = self.cached_blocks(token_ids)
        needed_cached = blocks_for(num_cached_tokens, bs)
        if needed_cached > len(available):
            raise RuntimeError(
                f"prefix index reported {num_cached_tokens} cached tokens but the KV pool "
                f"holds only {len(available) * bs} of them"
            )
        whole = num_cached_tokens // bs
        blocks = list(available[:whole])
        if num_cached_tokens % bs:
            partial = self._take()
            offsets = torch.arange(num_cached_tokens % bs)
            self.cache.copy_slots(available[whole] * bs + offsets, partial * bs + offsets)
            blocks.append(partial)
        while len(blocks) < blocks_for(len(token_ids), bs):
            blocks.append(self._take())
        for block in blocks:
            self._refcount[block] = self._refcount.get(block, 0) + 1
        return RequestBlocks(block_ids=blocks, num_cached_tokens=num_cached_tokens, shared=whole)

    def finish(self, token_ids: Sequence[int], blocks: RequestBlocks, *, keep_prefix: bool) -> None:
        """Release a request's blocks; with ``keep_prefix`` its whole prompt blocks stay cached."""
        if keep_prefix:
            keys = block_keys(token_ids, self.block_size)  # whole blocks only: fewer than ids
            for key, block in zip(keys, blocks.block_ids, strict=False):
                if self._cached.setdefault(key, block) == block:
                    self._cached_ids.add(block)
        for block in blocks.block_ids:
            self._release(block)

    def reset(self) -> None:
        """Drop every cached prefix block (in-flight blocks must have been finished)."""
        if self._refcount:
            raise RuntimeError(f"{len(self._refcount)} blocks are still held by running requests")
        self._free = list(range(self._next_block))
        self._cached.clear()
        self._cached_ids.clear()

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)
