"""Token-level invariant checks of ``BatchMetadata`` and of a split (vectorised, O(T)).

No Python loop runs per request or per token: per-token expectations come from
one ``np.repeat`` of per-request values, and the slot check is one gather from
the flattened block table. ``validate_split`` checks the parent once and each
ubatch's token-indexed arrays as the parent's slices (O(1) when they are views
of the parent's memory, as ``split_metadata`` makes them), and the request
fields with ``validate_split_requests``.
"""

from __future__ import annotations

import numpy as np

from afd_split.checks.request_checks import validate_split_requests
from afd_split.checks.token_runs import RUNS_MIN_TOKENS, token_fields_hold
from afd_split.errors import SplitInvariantError
from afd_split.plan.planner import SplitPlan

MROPE_POSITION_ROWS = 3
"""M-RoPE positions carry temporal / height / width rows."""

BLOCK_TABLE_NDIM = 2
"""block_table is [requests, max_blocks]."""


def expected_positions(qsl: np.ndarray, computed: np.ndarray, query_lens: np.ndarray):
    """Position of every token: its request's computed prefix plus its offset in the query."""
    positions = np.repeat(computed - qsl[:-1], query_lens)
    positions += np.arange(positions.size, dtype=np.int64)
    return positions


def block_coordinates(positions: np.ndarray, block_size: int):
    """(block index, offset in block) of every position; shifts when block_size is a power
    of two (the usual case), since int64 division has no vector instruction."""
    if block_size & (block_size - 1) == 0:
        shift = block_size.bit_length() - 1
        return positions >> shift, positions & (block_size - 1)
    return np.divmod(positions, block_size)


def expected_block_ids(block_table: np.ndarray, query_lens, block_index: np.ndarray):
    """Block id each token's KV lives in: its request's block-table row at ``block_index``."""
    width = block_table.shape[1]
    flat = np.repeat(np.arange(0, query_lens.size * width, width, dtype=np.int64), query_lens)
    flat += block_index
    return np.ascontiguousarray(block_table).reshape(-1).take(flat, mode="clip")


def expected_slots(block_table: np.ndarray, block_size: int, query_lens, positions):
    """KV slot of each token: its block's id * block_size + offset within the block."""
    block_index, offset = block_coordinates(positions, block_size)
    slots = expected_block_ids(block_table, query_lens, block_index) * block_size
    slots += offset
    return slots


def _check_shapes(metadata) -> None:
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


def _first_below(values: np.ndarray, minimum: int, template: str) -> None:
    """Raise for the first request whose value is below ``minimum``."""
    if values.item(values.argmin()) < minimum:
        req = int(np.flatnonzero(values < minimum)[0])
        raise SplitInvariantError(f"request {req}: " + template.format(int(values[req])))


def _request_of(qsl: np.ndarray, token: int) -> int:
    return int(qsl.searchsorted(token, side="right")) - 1


def validate_metadata(metadata) -> None:
    """``BatchMetadata.validate``: raise ``SplitInvariantError`` naming the first violation.

    Checks: shapes agree; query_start_loc starts at 0, ends at num_tokens and
    has no empty request entry; seq_len - query_len == num_computed_tokens;
    1-D positions continue each request's computed prefix (M-RoPE rows are
    shape-checked only); every block a request's tokens use is inside the block
    table and not negative; slot_mapping addresses each token's block through
    the request's block-table row.
    """
    _check_shapes(metadata)
    qsl = metadata.query_start_loc
    if metadata.num_reqs == 0 or metadata.num_tokens == 0:
        raise SplitInvariantError(
            f"empty batch: {metadata.num_reqs} requests, {metadata.num_tokens} tokens"
        )
    if qsl.item(0) != 0:
        raise SplitInvariantError(f"query_start_loc[0]={qsl.item(0)}, expected 0")
    if qsl.item(-1) != metadata.num_tokens:
        raise SplitInvariantError(
            f"query_start_loc[-1]={qsl.item(-1)} != num_tokens={metadata.num_tokens} "
            "(padding counted as real tokens, or tokens dropped)"
        )
    query_lens = qsl[1:] - qsl[:-1]
    _first_below(query_lens, 1, "empty request entry: query_len={}")
    computed, seq_lens = metadata.num_computed_tokens, metadata.seq_lens
    _first_below(computed, 0, "negative num_computed_tokens={}")
    mismatch = seq_lens - query_lens != computed
    if mismatch.any():
        req = int(np.flatnonzero(mismatch)[0])
        raise SplitInvariantError(
            f"request {req}: seq_len {int(seq_lens[req])} - query_len "
            f"{int(query_lens[req])} != num_computed_tokens {int(computed[req])}"
        )
    _check_token_fields(metadata, qsl, query_lens, computed, seq_lens)


def _check_token_fields(metadata, qsl, query_lens, computed, seq_lens) -> None:
    """Positions and slots against the request fields. From RUNS_MIN_TOKENS tokens,
    ``token_fields_hold`` accepts a valid batch in cache-sized chunks; otherwise the passes
    of ``name_token_violation`` over [T] int64 buffers (reused in place) check the batch and
    name the first violation."""
    if metadata.num_tokens < RUNS_MIN_TOKENS or not token_fields_hold(
        metadata, qsl, query_lens, computed, seq_lens
    ):
        name_token_violation(metadata, qsl, query_lens, computed, seq_lens)


def name_token_violation(metadata, qsl, query_lens, computed, seq_lens) -> None:
    """Raise ``SplitInvariantError`` for the first bad position, block or slot (whole-batch
    passes: only a failing batch, or the equivalence test, runs them)."""
    expected = expected_positions(qsl, computed, query_lens)
    unequal = np.empty(expected.size, dtype=bool)
    # M-RoPE rows follow image grids, so only 1-D positions have a checkable value;
    # 2-D ones were shape-checked above and split_metadata slices them like 1-D ones.
    positions = metadata.positions
    if positions.ndim == 1 and np.not_equal(positions, expected, out=unequal).any():
        token = int(np.flatnonzero(unequal)[0])
        raise SplitInvariantError(
            f"token {token} (request {_request_of(qsl, token)}): position "
            f"{positions[..., token].tolist()} != computed + offset = {int(expected[token])}"
        )
    block_size, width = metadata.block_size, metadata.block_table.shape[1]
    # Positions are consecutive per request, so its last token uses its highest block.
    last_blocks = (seq_lens - 1) // block_size
    if last_blocks.item(last_blocks.argmax()) >= width:
        beyond = int(np.flatnonzero(last_blocks >= width)[0])
        token = qsl.item(beyond) + max(0, width * block_size - computed.item(beyond))
        raise SplitInvariantError(
            f"token {token}: block {int(expected[token]) // block_size} is beyond the block "
            f"table's {width} columns"
        )
    block_index, offset = block_coordinates(expected, block_size)
    flat = np.repeat(np.arange(0, query_lens.size * width, width, dtype=np.int64), query_lens)
    flat += block_index
    # Indices are in range (block index checked above), so 'clip' never clips; with the
    # default mode='raise' numpy buffers ``out``, an extra [T] copy.
    table = np.ascontiguousarray(metadata.block_table).reshape(-1)
    slots = table.take(flat, out=block_index, mode="clip")
    lowest_block = slots.item(slots.argmin())
    slots *= block_size
    slots += offset
    slot_mapping = metadata.slot_mapping
    if np.not_equal(slot_mapping, slots, out=unequal).any() or lowest_block < 0:
        unequal |= slot_mapping < 0
        token = int(np.flatnonzero(unequal)[0])
        raise SplitInvariantError(
            f"token {token} (request {_request_of(qsl, token)}): slot "
            f"{int(slot_mapping[token])} != block-table slot {int(slots[token])}"
        )


def _same_or_equal(mine: np.ndarray, theirs: np.ndarray) -> bool:
    """Equal arrays; O(1) when ``mine`` is ``theirs``'s memory (a view split_metadata made)."""
    if mine.shape != theirs.shape or mine.dtype != theirs.dtype:
        return False
    if (
        mine.__array_interface__["data"][0] == theirs.__array_interface__["data"][0]
        and mine.strides == theirs.strides
    ):
        return True
    return np.array_equal(mine, theirs)


def validate_split(plan: SplitPlan, parent, parts) -> None:
    """Token-level check of a split: ``validate_split_requests``, the parent's own invariants,
    and every ubatch's slot_mapping / positions / block_table as the parent's slices.

    Together these give each ubatch's own invariants (its positions and slots are
    the parent's, its request fields the exact split), so each part is not
    re-validated token by token. Raises ``SplitInvariantError`` naming the ubatch.
    """
    if len(parts) != len(plan.ubatches):
        raise SplitInvariantError(f"{len(parts)} metadata parts for {len(plan.ubatches)} ubatches")
    for ubatch, part in zip(plan.ubatches, parts, strict=True):
        if part.num_tokens != ubatch.num_real_tokens:
            raise SplitInvariantError(
                f"ubatch {ubatch.index}: metadata has {part.num_tokens} tokens but the plan "
                f"gives it {ubatch.num_real_tokens} real tokens "
                f"({ubatch.num_padded_tokens} padding rows are not real work)"
            )
        if part.block_size != parent.block_size:
            raise SplitInvariantError(
                f"ubatch {ubatch.index}: block_size {part.block_size} != parent's "
                f"{parent.block_size}"
            )
    validate_split_requests(plan, parent, parts)
    try:
        validate_metadata(parent)
    except SplitInvariantError as error:
        raise SplitInvariantError(f"parent: {error}") from error
    for ubatch, part in zip(plan.ubatches, parts, strict=True):
        token_slice = ubatch.token_slice
        for name, mine, theirs in (
            ("slot_mapping", part.slot_mapping, parent.slot_mapping[token_slice]),
            ("positions", part.positions, parent.positions[..., token_slice]),
            ("block_table", part.block_table, parent.block_table[ubatch.request_slice]),
        ):
            if not _same_or_equal(mine, theirs):
                raise SplitInvariantError(
                    f"ubatch {ubatch.index}: {name} is not the parent's slice {token_slice}"
                )
