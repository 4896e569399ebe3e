"""Fast acceptance of the token-level checks, over (request, block) runs in cache-sized chunks.

The tokens of one request sit at consecutive positions, so those inside one KV
block form a run whose expected slots are ``(block id - block index) *
block_size + position``: a per-run constant plus the token index, as the
positions are. Both expectations are one ``np.repeat`` of per-run values plus
an ``arange``; no per-token division or block-table gather is needed (the
gather runs once per run). Tokens are processed in chunks of about
``CHUNK_TOKENS``: small temporaries stay in cache and reuse freed memory,
where [T]-sized ones cost fresh pages that outweigh the arithmetic.

``token_fields_hold`` only answers whether everything holds; when it does not,
``afd_split.checks.tokens`` locates and names the first violation.
"""

from __future__ import annotations

import numpy as np

CHUNK_TOKENS = 32768
"""Tokens per chunk: 256 KiB int64 temporaries, measured fastest of 4K..1M on a shared host."""

RUNS_MIN_TOKENS = CHUNK_TOKENS
"""Batches of fewer tokens fit one chunk; there the whole-batch passes make fewer numpy calls
(measured: faster up to ~4K tokens, slower from ~45K)."""


def _runs(computed, seq_lens, block_size: int, width: int, table: np.ndarray):
    """Per (request, block) run: its token count, position - token index offset base, and
    slot - position offset; None when a run's block is outside the table or negative."""
    first_blocks = computed // block_size
    last_blocks = (seq_lens - 1) // block_size
    if last_blocks.item(last_blocks.argmax()) >= width:
        return None
    runs_per_request = last_blocks - first_blocks + 1
    run_ends = runs_per_request.cumsum()
    num_runs = run_ends.item(-1)
    first_runs = run_ends - runs_per_request
    run_request = np.arange(computed.size, dtype=np.int64).repeat(runs_per_request)
    run_block = (first_blocks - first_runs).repeat(runs_per_request)
    run_block += np.arange(num_runs, dtype=np.int64)
    block_ids = table.take(run_request * width + run_block, mode="clip")  # in range: checked
    if block_ids.item(block_ids.argmin()) < 0:
        return None
    run_start = run_block * block_size
    run_stop = run_start + block_size
    run_start[first_runs] = computed
    run_stop[run_ends - 1] = seq_lens
    run_stop -= run_start
    block_ids -= run_block
    block_ids *= block_size
    return run_stop, run_request, block_ids


def token_fields_hold(metadata, qsl, query_lens, computed, seq_lens) -> bool:
    """True when 1-D positions continue each request's computed prefix and every slot is the
    block-table slot of its position through non-negative blocks inside the table.

    The request fields must already be checked (query_len >= 1, computed >= 0,
    seq_len - query_len == computed). Equal to the checks of
    ``token_checks._check_token_fields`` (int64 wrap-around included: both
    compute the same residues), so a True here means they pass.
    """
    block_size, table = metadata.block_size, metadata.block_table
    runs = _runs(
        computed, seq_lens, block_size, table.shape[1], np.ascontiguousarray(table).reshape(-1)
    )
    if runs is None:
        return False
    run_tokens, run_request, slot_minus_position = runs
    position_offset = (computed - qsl[:-1]).take(run_request)  # position - token index
    slot_offset = slot_minus_position + position_offset  # slot - token index
    run_token_ends = run_tokens.cumsum()
    num_tokens, num_runs = qsl.item(-1), run_tokens.size
    bounds = run_token_ends.searchsorted(
        np.arange(CHUNK_TOKENS, num_tokens, CHUNK_TOKENS), side="right"
    ).tolist()
    token_ends = run_token_ends.tolist()
    chunks, first = [], 0
    for last in (*bounds, num_runs):
        if last > first:
            chunks.append((first, last, token_ends[first - 1] if first else 0, token_ends[last - 1]))
            first = last
    longest = max(stop - start for _, _, start, stop in chunks)
    local = np.arange(longest, dtype=np.int64)
    unequal = np.empty(longest, dtype=bool)
    positions, slot_mapping = metadata.positions, metadata.slot_mapping
    check_positions = positions.ndim == 1  # M-RoPE rows are shape-checked only
    for first, last, start, stop in chunks:
        size = stop - start
        lengths = run_tokens[first:last]
        if check_positions:
            expected = (position_offset[first:last] + start).repeat(lengths)
            expected += local[:size]
            if np.not_equal(positions[start:stop], expected, out=unequal[:size]).any():
                return False
        expected = (slot_offset[first:last] + start).repeat(lengths)
        expected += local[:size]
        if np.not_equal(slot_mapping[start:stop], expected, out=unequal[:size]).any():
            return False
    return True
