"""Every check of the token-level ``validate_split`` / ``BatchMetadata.validate``, injected."""

import dataclasses

import numpy as np
import pytest

from afd_split import SplitConstraints, SplitInvariantError, plan_split
from afd_split.checks.metadata import BatchMetadata, split_metadata, validate_split

TB = "token_balanced"
BLOCK = 16
TOKENS, COMPUTED = [40, 100, 20], [0, 64, 0]


@pytest.fixture
def split():
    parent = BatchMetadata.from_requests(TOKENS, COMPUTED, block_size=BLOCK)
    plan = plan_split(TOKENS, policy=TB, constraints=SplitConstraints(align=8, padded_total=176))
    return plan, parent, split_metadata(plan, parent)


def changed(array, index, delta=1):
    array = np.array(array)
    array[index] += delta
    return array


def test_the_real_split_passes_with_views_and_with_equal_copies(split):
    plan, parent, parts = split
    validate_split(plan, parent, parts)
    copies = [
        dataclasses.replace(
            part,
            slot_mapping=part.slot_mapping.copy(),
            positions=part.positions.copy(),
            block_table=part.block_table.copy(),
        )
        for part in parts
    ]
    validate_split(plan, parent, copies)


@pytest.mark.parametrize(
    ("field", "index"),
    [("slot_mapping", 3), ("positions", -1), ("block_table", (0, 0))],
)
def test_a_part_s_token_or_block_arrays_off_the_parent_slice_are_caught(split, field, index):
    plan, parent, (head, tail) = split
    broken = dataclasses.replace(tail, **{field: changed(getattr(tail, field), index)})
    with pytest.raises(SplitInvariantError, match=f"ubatch 1: {field} is not the parent's slice"):
        validate_split(plan, parent, [head, broken])


def test_wrong_part_count_block_size_and_request_count_are_caught(split):
    plan, parent, (head, tail) = split
    with pytest.raises(SplitInvariantError, match="1 metadata parts for 2 ubatches"):
        validate_split(plan, parent, [head])
    other_block = dataclasses.replace(tail, block_size=2 * BLOCK)
    with pytest.raises(SplitInvariantError, match="ubatch 1: block_size 32"):
        validate_split(plan, parent, [head, other_block])
    one_request_less = dataclasses.replace(
        tail,
        query_start_loc=tail.query_start_loc[:-1],
        seq_lens=tail.seq_lens[:-1],
        num_computed_tokens=tail.num_computed_tokens[:-1],
        block_table=tail.block_table[:-1],
    )
    with pytest.raises(SplitInvariantError, match=r"^shape: ubatch 1"):
        validate_split(plan, parent, [head, one_request_less])


def test_a_broken_parent_is_caught_even_when_the_parts_are_its_exact_slices(split):
    plan, parent, _ = split
    broken_parent = dataclasses.replace(parent, slot_mapping=changed(parent.slot_mapping, 50))
    parts = split_metadata(plan, broken_parent)
    with pytest.raises(SplitInvariantError, match=r"^parent: token 50 \(request 1\): slot"):
        validate_split(plan, broken_parent, parts)


def meta(**changes):
    parent = BatchMetadata.from_requests(TOKENS, COMPUTED, block_size=BLOCK)
    return dataclasses.replace(parent, **changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"num_computed_tokens": [0, 64]}, r"num_computed_tokens has shape \(2,\)"),
        ({"block_table": np.zeros(3, np.int64)}, "block_table has shape"),
        ({"positions": np.zeros((2, 160), np.int64)}, "positions has shape"),
        (
            {
                "query_start_loc": [0],
                "seq_lens": [],
                "num_computed_tokens": [],
                "slot_mapping": [],
                "block_table": np.zeros((0, 1)),
                "positions": [],
            },
            "empty batch",
        ),
        ({"query_start_loc": [1, 40, 140, 160]}, r"query_start_loc\[0\]=1"),
        ({"query_start_loc": [0, 40, 140, 150]}, r"query_start_loc\[-1\]=150"),
        ({"query_start_loc": [0, 40, 40, 160]}, "request 1: empty request entry"),
        ({"num_computed_tokens": [0, 64, -1], "seq_lens": [40, 164, 19]}, "request 2: negative"),
        ({"seq_lens": [40, 165, 20]}, "request 1: seq_len 165 - query_len 100"),
        ({"positions": changed(meta().positions, 45)}, r"token 45 \(request 1\): position"),
        ({"block_table": meta().block_table[:, :3]}, "beyond the block table's 3 columns"),
        ({"slot_mapping": changed(meta().slot_mapping, 7)}, r"token 7 \(request 0\): slot"),
    ],
)
def test_every_metadata_check_catches_its_fault(changes, message):
    with pytest.raises(SplitInvariantError, match=message):
        meta(**changes).validate()


def test_a_negative_block_id_in_use_is_caught_even_when_slots_agree():
    parent = meta()
    table = parent.block_table.copy()
    table[0, 0] = -1
    slots = parent.slot_mapping.copy()
    slots[:BLOCK] = -BLOCK + np.arange(BLOCK)  # what the table would give
    with pytest.raises(SplitInvariantError, match=r"token 0 \(request 0\): slot -16"):
        dataclasses.replace(parent, block_table=table, slot_mapping=slots).validate()


def test_non_power_of_two_block_sizes_are_checked_too():
    parent = BatchMetadata.from_requests(TOKENS, COMPUTED, block_size=24)
    parent.validate()
    with pytest.raises(SplitInvariantError, match=r"token 99 \(request 1\): slot"):
        dataclasses.replace(parent, slot_mapping=changed(parent.slot_mapping, 99)).validate()
