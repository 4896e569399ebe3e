"""What one batch's attention derives from its metadata alone, made once per forward.

Every layer of a forward attends the same rows under the same metadata: the rows'
positions and RoPE tables, the slots written, each request's context slots and each
query block's causal mask depend on the metadata, not on the layer's activations.
``DecoderLayer.attention`` derived them again in every layer (a per-forward host
cost that grows with the layer count); the executor now makes one
``AttentionGeometry`` per ubatch and metadata and every layer reads it. The values
come from the same operations in the same order, so outputs are bit-identical
(``tests/cpu_backend/test_attention_geometry.py`` compares against a fresh
derivation per layer, on split, PCP, chunked and prefix-hit batches).

Nothing here is mutated after it is made: the masks handed to the attention kernel
are read only, and a layer that narrows a block's mask (the indexer's top-k) works
on its own copy (``DecoderLayer._sparse_mask`` clones the causal mask).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pytest_afd.backends.cpu.config import ModelConfig
from pytest_afd.backends.cpu.kv_cache import context_slots
from pytest_afd.backends.cpu.ops import KEY_BLOCK, QUERY_BLOCK, pad_rows, rope_tables, round_up


def sdpa_mask(mask: torch.Tensor, key_end: int, padded_end: int, num_rows: int) -> torch.Tensor:
    """A block's [rows, key_end] mask as the attention kernel reads it: keys padded to
    ``padded_end`` (masked out), rows padded to the kernel minimum, each padded query
    row attending one key."""
    mask, _ = pad_rows(F.pad(mask, (0, padded_end - key_end), value=False))
    mask[num_rows:, 0] = True  # padded query rows attend one key
    return mask

SLOT_FREE_FIELDS = ("query_start_loc", "seq_lens", "block_table", "positions")
"""The metadata fields a geometry reads besides ``slot_mapping`` and ``block_size``."""


@dataclass(frozen=True, eq=False)
class QueryBlock:
    """One block of a request's query rows (at most ``QUERY_BLOCK``)."""

    rows: torch.Tensor
    key_end: int
    padded_end: int
    causal: torch.Tensor
    """[rows, key_end]: key ``k`` visible to a row at position ``p`` when ``k <= p``."""
    mask: torch.Tensor | None
    """The kernel's mask (``sdpa_mask`` of ``causal``) where no layer narrows it: the block
    reaches no more than ``index_topk`` keys. None: each layer narrows ``causal`` itself."""

    @property
    def num_rows(self) -> int:
        return len(self.rows)


@dataclass(frozen=True, eq=False)
class RequestGeometry:
    """One request with query rows in the batch: its rows, context slots and blocks."""

    index: int
    rows: torch.Tensor
    context: torch.Tensor
    blocks: tuple[QueryBlock, ...]


@dataclass(frozen=True, eq=False)
class AttentionGeometry:
    """Per-forward attention inputs of one batch's rows under ``metadata`` (every layer's)."""

    metadata: object
    num_rows: int
    rows: torch.Tensor
    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    slots: torch.Tensor
    needs_index: bool
    """Some request has more than ``index_topk`` tokens: the layers run the indexer's query."""
    requests: tuple[RequestGeometry, ...]

    @classmethod
    def of(cls, config: ModelConfig, metadata, real_rows: np.ndarray | None,
           num_rows: int) -> AttentionGeometry:
        """Derived exactly as ``DecoderLayer.attention`` derives it (see the module doc)."""
        rows = real_row_tensor(metadata, real_rows, num_rows)
        positions = row_positions(metadata, rows, num_rows)
        cos, sin = rope_tables(config, positions)
        seq_lens = np.asarray(metadata.seq_lens)
        starts = np.asarray(metadata.query_start_loc)
        requests = []
        for request in range(len(seq_lens)):
            request_rows = rows[int(starts[request]):int(starts[request + 1])]
            if len(request_rows):
                context = context_slots(np.asarray(metadata.block_table[request]),
                                        int(seq_lens[request]), metadata.block_size)
                requests.append(RequestGeometry(request, request_rows, context,
                                                _blocks(config, positions, request_rows)))
        return cls(
            metadata=metadata, num_rows=num_rows, rows=rows, positions=positions, cos=cos,
            sin=sin, slots=torch.from_numpy(np.array(metadata.slot_mapping, dtype=np.int64)),
            needs_index=bool((seq_lens > config.index_topk).any()), requests=tuple(requests),
        )

    def with_slots_of(self, metadata) -> AttentionGeometry | None:
        """This geometry for ``metadata`` where it differs from this one's metadata in its
        slots alone (every other field read above the same array), else None: under PCP the
        dense layers' metadata is the stage's with the full batch's slots."""
        if metadata.block_size != self.metadata.block_size or any(
                getattr(metadata, name) is not getattr(self.metadata, name)
                for name in SLOT_FREE_FIELDS):
            return None
        return dataclasses.replace(
            self, metadata=metadata,
            slots=torch.from_numpy(np.array(metadata.slot_mapping, dtype=np.int64)))

    def check_for(self, metadata, num_rows: int) -> None:
        """Refuse a geometry made for another batch (a stale one would misplace every row)."""
        if self.metadata is not metadata or self.num_rows != num_rows:
            raise ValueError(
                f"attention geometry of {self.num_rows} rows made for another metadata object; "
                f"this call has {num_rows} rows")


def _blocks(config: ModelConfig, positions: torch.Tensor,
            request_rows: torch.Tensor) -> tuple[QueryBlock, ...]:
    blocks = []
    for start in range(0, len(request_rows), QUERY_BLOCK):
        block_rows = request_rows[start:start + QUERY_BLOCK]
        block_pos = positions[block_rows]
        key_end = int(block_pos.max()) + 1
        causal = torch.arange(key_end)[None, :] <= block_pos[:, None]
        padded_end = round_up(key_end, KEY_BLOCK)
        mask = (None if key_end > config.index_topk
                else sdpa_mask(causal, key_end, padded_end, len(block_rows)))
        blocks.append(QueryBlock(block_rows, key_end, padded_end, causal, mask))
    return tuple(blocks)


def real_row_tensor(metadata, real_rows: np.ndarray | None, num_rows: int) -> torch.Tensor:
    """Each real token's row (``real_rows``; None: rows are the tokens), checked against the
    metadata's token count."""
    num_tokens = int(np.asarray(metadata.query_start_loc)[-1])
    if real_rows is None:
        if num_rows != num_tokens:
            raise ValueError(f"hidden has {num_rows} rows but metadata has {num_tokens} tokens")
        return torch.arange(num_tokens)
    rows = torch.from_numpy(np.array(real_rows, dtype=np.int64))
    if len(rows) != num_tokens:
        raise ValueError(f"real_rows has {len(rows)} entries but metadata has {num_tokens} tokens")
    return rows


def row_positions(metadata, rows: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Position of every row (padding rows get 0)."""
    positions = np.asarray(metadata.positions)
    if positions.ndim != 1:
        raise ValueError(f"positions with shape {positions.shape}; DeepSeek uses 1-D positions")
    out = torch.zeros(num_rows, dtype=torch.int64)
    out[rows] = torch.from_numpy(positions.astype(np.int64))
    return out
