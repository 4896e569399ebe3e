"""The fast acceptance paths of the checks agree with the checks that name violations.

``token_fields_hold`` (runs, chunked) must accept exactly the batches that
``name_token_violation`` (whole-batch passes) lets through, so a fast True never
hides an error and every rejection keeps its message.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from afd_split import BatchMetadata, SplitInvariantError, token_runs
from afd_split.checks.token_runs import token_fields_hold
from afd_split.checks.tokens import name_token_violation

FIELDS = ("slot_mapping", "positions", "block_table")


def slow_passes(meta) -> bool:
    qsl = meta.query_start_loc
    try:
        name_token_violation(
            meta, qsl, qsl[1:] - qsl[:-1], meta.num_computed_tokens, meta.seq_lens
        )
    except SplitInvariantError:
        return False
    return True


def fast_passes(meta) -> bool:
    qsl = meta.query_start_loc
    return token_fields_hold(
        meta, qsl, qsl[1:] - qsl[:-1], meta.num_computed_tokens, meta.seq_lens
    )


@st.composite
def corrupted_batches(draw):
    tokens = draw(st.lists(st.integers(1, 300), min_size=1, max_size=12))
    computed = draw(st.lists(st.integers(0, 700), min_size=len(tokens), max_size=len(tokens)))
    block_size = draw(st.sampled_from((1, 3, 16, 128, 1000)))
    meta = BatchMetadata.from_requests(
        tokens, computed, block_size=block_size, mrope=draw(st.booleans())
    )
    fault = draw(st.sampled_from(("none", *FIELDS, "narrow_table")))
    if fault == "narrow_table":
        width = meta.block_table.shape[1]
        return dataclasses.replace(
            meta, block_table=meta.block_table[:, : draw(st.integers(0, width - 1))]
        )
    if fault == "none":
        return meta
    array = np.array(getattr(meta, fault))
    flat = array.reshape(-1)
    index = draw(st.integers(0, flat.size - 1))
    flat[index] = draw(st.sampled_from((flat[index] + 1, flat[index] - 1, -1, -flat[index] - 1)))
    return dataclasses.replace(meta, **{fault: array})


@settings(max_examples=400, deadline=None, database=None)
@given(corrupted_batches(), st.sampled_from((1, 7, 64, token_runs.CHUNK_TOKENS)))
def test_fast_token_check_accepts_exactly_what_the_naming_check_accepts(meta, chunk):
    original = token_runs.CHUNK_TOKENS
    token_runs.CHUNK_TOKENS = chunk  # small chunks: many chunk boundaries inside requests
    try:
        assert fast_passes(meta) == slow_passes(meta)
    finally:
        token_runs.CHUNK_TOKENS = original


@pytest.mark.parametrize("field", FIELDS)
def test_a_fault_past_the_first_chunk_is_caught_by_the_fast_path(field):
    tokens = [token_runs.CHUNK_TOKENS + 5000, 3000, 41000]
    meta = BatchMetadata.from_requests(tokens, [0, 200, 70], block_size=128)
    assert fast_passes(meta) and slow_passes(meta)
    array = np.array(getattr(meta, field))
    array.reshape(-1)[-7] += 1
    broken = dataclasses.replace(meta, **{field: array})
    assert not fast_passes(broken)
    with pytest.raises(SplitInvariantError):
        broken.validate()
