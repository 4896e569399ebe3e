"""Batch attention metadata in a framework-neutral form, its invariant checker and its split.

All arrays are int64 numpy arrays held read-only, so a ubatch can share the
parent's token- and request-indexed arrays as views without any risk of one
stage writing into another's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from afd_split.checks.requests import split_request_arrays
from afd_split.checks.tokens import (
    BLOCK_TABLE_NDIM,
    MROPE_POSITION_ROWS,
    expected_positions,
    expected_slots,
    validate_metadata,
    validate_split,
)
from afd_split.plan.constraints import checked_int
from afd_split.plan.planner import SplitPlan, as_token_counts
from afd_split.plan.vector import matched_computed_counts

DEFAULT_BLOCK_SIZE = 128
"""KV-cache block (page) size of the reference recipe."""

UNUSED_BLOCK_ID = -1
"""Block-table filler in synthesized tables; any read of it shows up as a negative slot."""


def _read_only_int64(name: str, value) -> np.ndarray:
    """int64 view (or copy when the dtype differs) that cannot be written through."""
    array = np.asarray(value)
    if array.dtype != np.int64:
        if array.size and array.dtype.kind not in "iu":
            raise ValueError(f"BatchMetadata.{name} must hold integers, got dtype {array.dtype}")
        array = array.astype(np.int64)
    elif not array.flags.writeable:
        return array
    else:
        array = array.view()
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class BatchMetadata:
    """Per-batch attention metadata of REAL tokens only (padding is described by ``UBatch``).

    query_start_loc [R+1], seq_lens [R], num_computed_tokens [R] are request-indexed;
    slot_mapping [T] and positions [T] (or [3, T] for M-RoPE) are token-indexed;
    block_table is [R, max_blocks]. Construction only normalises arrays;
    ``validate()`` checks the invariants so that a broken object can be built and
    shown to be caught.
    """

    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    num_computed_tokens: np.ndarray
    slot_mapping: np.ndarray
    block_table: np.ndarray
    positions: np.ndarray
    block_size: int = DEFAULT_BLOCK_SIZE

    def __post_init__(self) -> None:
        for name, value in (
            ("query_start_loc", self.query_start_loc),
            ("seq_lens", self.seq_lens),
            ("num_computed_tokens", self.num_computed_tokens),
            ("slot_mapping", self.slot_mapping),
            ("block_table", self.block_table),
            ("positions", self.positions),
        ):
            object.__setattr__(self, name, _read_only_int64(name, value))
        block_size = checked_int("BatchMetadata.block_size", self.block_size, 1)
        object.__setattr__(self, "block_size", block_size)

    @property
    def num_reqs(self) -> int:
        """Requests R in this batch."""
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        """Real tokens T in this batch."""
        return self.slot_mapping.shape[0]

    @property
    def query_lens(self) -> np.ndarray:
        """Scheduled tokens per request, from query_start_loc."""
        return np.diff(self.query_start_loc)

    @property
    def max_query_len(self) -> int:
        """Longest query in the batch (0 when empty)."""
        return int(self.query_lens.max()) if self.num_reqs else 0

    @property
    def max_seq_len(self) -> int:
        """Longest sequence (computed + scheduled) in the batch (0 when empty)."""
        return int(self.seq_lens.max()) if self.num_reqs else 0

    @classmethod
    def from_requests(
        cls,
        num_scheduled_tokens,
        num_computed_tokens=None,
        block_table=None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        *,
        mrope: bool = False,
    ) -> BatchMetadata:
        """Consistent metadata for a batch; a block table is synthesized when not given.

        The synthesized table gives every request its own consecutive block ids,
        so a slot read through the wrong request's row is detectable.
        """
        # Checked first: every derived array divides by it.
        block_size = checked_int("BatchMetadata.from_requests block_size", block_size, 1)
        tokens = as_token_counts(num_scheduled_tokens, name="num_scheduled_tokens", minimum=1)
        if num_computed_tokens is None:
            computed = np.zeros_like(tokens)
        else:
            computed = matched_computed_counts(num_computed_tokens, tokens)
        seq_lens = computed + tokens
        blocks_needed = -(-seq_lens // block_size)
        if block_table is None:
            block_table = _synthesize_block_table(blocks_needed)
        else:
            block_table = np.asarray(block_table)
            if block_table.ndim != BLOCK_TABLE_NDIM or block_table.shape[0] != tokens.size:
                raise ValueError(
                    f"block_table must be [{tokens.size}, max_blocks], got {block_table.shape}"
                )
            if block_table.shape[1] < int(blocks_needed.max()):
                raise ValueError(
                    f"block_table has {block_table.shape[1]} columns but a request needs "
                    f"{int(blocks_needed.max())} blocks of {block_size} tokens"
                )
        query_start_loc = np.concatenate(([0], tokens.cumsum()))
        positions = expected_positions(query_start_loc, computed, tokens)
        slot_mapping = expected_slots(np.asarray(block_table), block_size, tokens, positions)
        if mrope:
            positions = np.broadcast_to(positions, (MROPE_POSITION_ROWS, positions.size)).copy()
        return cls(
            query_start_loc=query_start_loc,
            seq_lens=seq_lens,
            num_computed_tokens=computed,
            slot_mapping=slot_mapping,
            block_table=block_table,
            positions=positions,
            block_size=block_size,
        )

    def validate(self) -> None:
        """Raise ``SplitInvariantError`` naming the first violated invariant
        (``afd_split.checks.tokens.validate_metadata`` lists the checks)."""
        validate_metadata(self)


def _synthesize_block_table(blocks_needed: np.ndarray) -> np.ndarray:
    """Consecutive, disjoint block ids per request; unused columns hold UNUSED_BLOCK_ID."""
    width = int(blocks_needed.max())
    first_block = blocks_needed.cumsum() - blocks_needed
    columns = np.arange(width)
    table = first_block[:, None] + columns[None, :]
    return np.where(columns[None, :] < blocks_needed[:, None], table, UNUSED_BLOCK_ID)


def _from_trusted_arrays(**fields) -> BatchMetadata:
    """Build without ``__post_init__`` normalisation: every array is already int64 read-only.

    ``split_metadata`` runs per forward step; skipping six redundant dtype/flag
    checks per ubatch is a measurable share of its budget.
    """
    metadata = object.__new__(BatchMetadata)
    metadata.__dict__.update(fields)
    return metadata


def split_metadata(plan: SplitPlan, metadata: BatchMetadata, *, validate: bool = False):
    """Slice the parent's metadata into one ``BatchMetadata`` per ubatch (real tokens only).

    Token-indexed arrays (slot_mapping, positions) take the token slice and
    request-indexed ones (seq_lens, num_computed_tokens, block_table) the
    request slice; slices of the parent's read-only arrays are shared views.
    query_start_loc is clipped to the token slice and rebased. A ubatch's first
    request that started in the previous ubatch gets ``num_computed_tokens +=
    tokens already there`` (its seq_len stays the original); a last request cut
    by the slice ends at ``seq_len - tokens left for the next ubatch``, i.e.
    computed + head. The parent is never mutated. ``validate=True`` also runs
    ``validate_split`` (O(T); meant for tests and debugging).
    """
    parts = []
    request_parts = split_request_arrays(
        plan, metadata.query_start_loc, metadata.seq_lens, metadata.num_computed_tokens
    )
    for ubatch, (qsl, seq_lens, computed) in zip(plan.ubatches, request_parts, strict=True):
        token_slice, request_slice = ubatch.token_slice, ubatch.request_slice
        parts.append(
            _from_trusted_arrays(
                query_start_loc=qsl,
                seq_lens=seq_lens,
                num_computed_tokens=computed,
                slot_mapping=metadata.slot_mapping[token_slice],
                block_table=metadata.block_table[request_slice],
                positions=metadata.positions[..., token_slice],
                block_size=metadata.block_size,
            )
        )
    if validate:
        validate_split(plan, metadata, parts)
    return parts
