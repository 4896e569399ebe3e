"""Batch attention metadata in a framework-neutral form, its invariant checker and its split.

All arrays are int64 numpy arrays held read-only, so a ubatch can share the
parent's token- and request-indexed arrays as views without any risk of one
stage writing into another's metadata.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from afd_split.errors import SplitInvariantError
from afd_split.plan import SplitPlan, as_token_counts
from afd_split.requests import split_request_arrays

DEFAULT_BLOCK_SIZE = 128
"""KV-cache block (page) size of the reference recipe."""

UNUSED_BLOCK_ID = -1
"""Block-table filler in synthesized tables; any read of it shows up as a negative slot."""

MROPE_POSITION_ROWS = 3
"""M-RoPE positions carry temporal / height / width rows."""

BLOCK_TABLE_NDIM = 2
"""block_table is [requests, max_blocks]."""


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
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int):
            raise ValueError(f"BatchMetadata.block_size must be an int, got {self.block_size!r}")
        if self.block_size < 1:
            raise ValueError(f"BatchMetadata.block_size must be >= 1, got {self.block_size}")

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
        tokens = as_token_counts(num_scheduled_tokens, name="num_scheduled_tokens", minimum=1)
        if num_computed_tokens is None:
            computed = np.zeros_like(tokens)
        else:
            computed = as_token_counts(num_computed_tokens, name="num_computed_tokens", minimum=0)
            if computed.shape != tokens.shape:
                raise ValueError(
                    f"num_computed_tokens has {computed.size} entries but "
                    f"num_scheduled_tokens has {tokens.size}"
                )
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
        request_of_token = np.repeat(np.arange(tokens.size), tokens)
        positions = (
            np.arange(int(query_start_loc[-1]))
            - query_start_loc[request_of_token]
            + computed[request_of_token]
        )
        slot_mapping = _slots(np.asarray(block_table), block_size, request_of_token, positions)
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
        """Raise ``SplitInvariantError`` naming the first violated invariant.

        Checks: shapes agree; query_start_loc starts at 0, ends at num_tokens and
        has no empty request entry; seq_len - query_len == num_computed_tokens;
        1-D positions continue each request's computed prefix (M-RoPE rows are
        shape-checked only); slot_mapping addresses each token's block through
        the request's block-table row.
        """
        _check_shapes(self)
        qsl = self.query_start_loc
        if self.num_reqs == 0 or self.num_tokens == 0:
            raise SplitInvariantError(
                f"empty batch: {self.num_reqs} requests, {self.num_tokens} tokens"
            )
        if int(qsl[0]) != 0:
            raise SplitInvariantError(f"query_start_loc[0]={int(qsl[0])}, expected 0")
        if int(qsl[-1]) != self.num_tokens:
            raise SplitInvariantError(
                f"query_start_loc[-1]={int(qsl[-1])} != num_tokens={self.num_tokens} "
                "(padding counted as real tokens, or tokens dropped)"
            )
        query_lens = np.diff(qsl)
        _first_violation(query_lens < 1, "empty request entry: query_len={} ", query_lens)
        computed = self.num_computed_tokens
        _first_violation(computed < 0, "negative num_computed_tokens={} ", computed)
        mismatch = self.seq_lens - query_lens != computed
        if mismatch.any():
            req = int(np.flatnonzero(mismatch)[0])
            raise SplitInvariantError(
                f"request {req}: seq_len {int(self.seq_lens[req])} - query_len "
                f"{int(query_lens[req])} != num_computed_tokens {int(computed[req])}"
            )
        request_of_token = np.repeat(np.arange(self.num_reqs), query_lens)
        expected = np.arange(self.num_tokens) - qsl[request_of_token] + computed[request_of_token]
        # M-RoPE rows follow image grids, so only 1-D positions have a checkable value;
        # 2-D ones were shape-checked above and split_metadata slices them like 1-D ones.
        wrong = self.positions != expected if self.positions.ndim == 1 else np.zeros(0, bool)
        if wrong.any():
            token = int(np.flatnonzero(wrong)[0])
            raise SplitInvariantError(
                f"token {token} (request {int(request_of_token[token])}): position "
                f"{self.positions[..., token].tolist()} != computed + offset = "
                f"{int(expected[token])}"
            )
        block_index = expected // self.block_size
        if int(block_index.max()) >= self.block_table.shape[1]:
            token = int(np.flatnonzero(block_index >= self.block_table.shape[1])[0])
            raise SplitInvariantError(
                f"token {token}: block {int(block_index[token])} is beyond the block table's "
                f"{self.block_table.shape[1]} columns"
            )
        slots = _slots(self.block_table, self.block_size, request_of_token, expected)
        bad = (self.slot_mapping != slots) | (self.slot_mapping < 0)
        if bad.any():
            token = int(np.flatnonzero(bad)[0])
            raise SplitInvariantError(
                f"token {token} (request {int(request_of_token[token])}): slot "
                f"{int(self.slot_mapping[token])} != block-table slot {int(slots[token])}"
            )


def _check_shapes(metadata: BatchMetadata) -> None:
    """Array ranks and lengths must agree with R and T."""
    num_reqs, num_tokens = metadata.num_reqs, metadata.num_tokens
    expected_shapes = {
        "query_start_loc": (num_reqs + 1,),
        "seq_lens": (num_reqs,),
        "num_computed_tokens": (num_reqs,),
        "slot_mapping": (num_tokens,),
    }
    for name, shape in expected_shapes.items():
        actual = getattr(metadata, name).shape
        if actual != shape:
            raise SplitInvariantError(f"{name} has shape {actual}, expected {shape}")
    if metadata.block_table.ndim != BLOCK_TABLE_NDIM or metadata.block_table.shape[0] != num_reqs:
        raise SplitInvariantError(
            f"block_table has shape {metadata.block_table.shape}, expected ({num_reqs}, max_blocks)"
        )
    positions_shape = metadata.positions.shape
    if positions_shape not in ((num_tokens,), (MROPE_POSITION_ROWS, num_tokens)):
        raise SplitInvariantError(
            f"positions has shape {positions_shape}, expected ({num_tokens},) or "
            f"({MROPE_POSITION_ROWS}, {num_tokens})"
        )


def _first_violation(mask: np.ndarray, template: str, values: np.ndarray) -> None:
    """Raise for the first request where ``mask`` holds."""
    if mask.any():
        req = int(np.flatnonzero(mask)[0])
        raise SplitInvariantError(f"request {req}: " + template.format(int(values[req])).strip())


def _synthesize_block_table(blocks_needed: np.ndarray) -> np.ndarray:
    """Consecutive, disjoint block ids per request; unused columns hold UNUSED_BLOCK_ID."""
    width = int(blocks_needed.max())
    first_block = blocks_needed.cumsum() - blocks_needed
    columns = np.arange(width)
    table = first_block[:, None] + columns[None, :]
    return np.where(columns[None, :] < blocks_needed[:, None], table, UNUSED_BLOCK_ID)


def _slots(
    block_table: np.ndarray, block_size: int, request_of_token: np.ndarray, positions: np.ndarray
) -> np.ndarray:
    """KV slot of each token: its block's id * block_size + offset within the block."""
    blocks = block_table[request_of_token, positions // block_size]
    return blocks * block_size + positions % block_size


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


def validate_split(plan: SplitPlan, parent: BatchMetadata, parts) -> None:
    """Cross-ubatch invariants: each part valid, real tokens conserved, boundary piece consistent.

    Raises ``SplitInvariantError``. Catches padding counted as real work (token
    totals exceed T), dropped or shifted token-indexed arrays, an empty ubatch
    and a tail whose computed tokens were not advanced past the head.
    """
    if len(parts) != len(plan.ubatches):
        raise SplitInvariantError(f"{len(parts)} metadata parts for {len(plan.ubatches)} ubatches")
    for ubatch, part in zip(plan.ubatches, parts, strict=True):
        try:
            part.validate()
        except SplitInvariantError as error:
            raise SplitInvariantError(f"ubatch {ubatch.index}: {error}") from error
        if part.num_tokens != ubatch.num_real_tokens:
            raise SplitInvariantError(
                f"ubatch {ubatch.index}: metadata has {part.num_tokens} tokens but the plan "
                f"gives it {ubatch.num_real_tokens} real tokens "
                f"({ubatch.num_padded_tokens} padding rows are not real work)"
            )
        if part.num_reqs != ubatch.request_slice.stop - ubatch.request_slice.start:
            raise SplitInvariantError(
                f"ubatch {ubatch.index}: metadata has {part.num_reqs} requests, plan slice is "
                f"{ubatch.request_slice}"
            )
        token_slice = ubatch.token_slice
        for name, mine, theirs in (
            ("slot_mapping", part.slot_mapping, parent.slot_mapping[token_slice]),
            ("positions", part.positions, parent.positions[..., token_slice]),
            ("block_table", part.block_table, parent.block_table[ubatch.request_slice]),
        ):
            if mine.shape != theirs.shape or not np.array_equal(mine, theirs):
                raise SplitInvariantError(
                    f"ubatch {ubatch.index}: {name} is not the parent's slice {token_slice}"
                )
    if sum(part.num_tokens for part in parts) != parent.num_tokens:
        raise SplitInvariantError(
            f"ubatches carry {sum(part.num_tokens for part in parts)} real tokens, parent has "
            f"{parent.num_tokens}"
        )
    last = parts[-1]
    parent_last = plan.ubatches[-1].request_slice.stop - 1
    if int(last.seq_lens[-1]) != int(parent.seq_lens[parent_last]):
        raise SplitInvariantError(
            f"last request: seq_len {int(last.seq_lens[-1])} != parent's "
            f"{int(parent.seq_lens[parent_last])}"
        )
    if plan.boundary_request is not None:
        head, tail = parts
        if int(tail.num_computed_tokens[0]) != int(head.seq_lens[-1]):
            raise SplitInvariantError(
                f"boundary request {plan.boundary_request}: tail num_computed_tokens "
                f"{int(tail.num_computed_tokens[0])} != head seq_len {int(head.seq_lens[-1])}"
            )
