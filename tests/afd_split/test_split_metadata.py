"""split_metadata, the invariant checker, merge order, and regressions of known splitter bugs."""

import dataclasses

import numpy as np
import pytest
import torch

from afd_split import SplitConstraints, SplitInvariantError, SplitPolicy, plan_split
from afd_split.checks.metadata import BatchMetadata, split_metadata, validate_split
from afd_split.engine.rows import gather_ubatch_rows, merge_outputs

TB = SplitPolicy.TOKEN_BALANCED
BLOCK = 16


def make(tokens, computed=None, **kwargs):
    return BatchMetadata.from_requests(tokens, computed, block_size=BLOCK, **kwargs)


def split(tokens, computed=None, constraints=None, policy=TB, **kwargs):
    constraints = constraints or SplitConstraints()
    parent = make(tokens, computed, **kwargs)
    plan = plan_split(tokens, policy=policy, constraints=constraints, num_computed_tokens=computed)
    return plan, parent, split_metadata(plan, parent, validate=True)


def test_boundary_request_appears_in_both_with_adjusted_lengths():
    plan, _parent, (head, tail) = split([40, 100, 20], [0, 64, 0])
    assert plan.split_token == 80 and plan.boundary_request == 1
    assert head.query_start_loc.tolist() == [0, 40, 80]
    assert head.num_computed_tokens.tolist() == [0, 64]
    assert head.seq_lens.tolist() == [40, 64 + 40]  # computed + head
    assert tail.query_start_loc.tolist() == [0, 60, 80]
    assert tail.num_computed_tokens.tolist() == [64 + 40, 0]  # computed + head
    assert tail.seq_lens.tolist() == [164, 20]  # original seq_len
    assert head.max_query_len == 40 and tail.max_query_len == 60
    assert head.max_seq_len == 104 and tail.max_seq_len == 164


def test_token_indexed_arrays_follow_the_token_slice_and_block_table_the_request_slice():
    _plan, parent, (head, tail) = split([40, 100, 20], [0, 64, 0])
    assert np.array_equal(
        np.concatenate([head.slot_mapping, tail.slot_mapping]), parent.slot_mapping
    )
    assert np.array_equal(np.concatenate([head.positions, tail.positions]), parent.positions)
    # Positions and slots of the split request continue across the cut.
    assert head.positions[-1] + 1 == tail.positions[0] == 64 + 40
    assert tail.positions[0] % BLOCK != 0  # the cut falls inside a KV block ...
    assert head.slot_mapping[-1] + 1 == tail.slot_mapping[0]  # ... so the slots are adjacent
    assert np.array_equal(head.block_table, parent.block_table[0:2])
    assert np.array_equal(tail.block_table, parent.block_table[1:3])


def test_split_exactly_on_a_request_boundary_creates_no_empty_entry():
    plan, _parent, (head, tail) = split([30, 30, 30, 30])
    assert plan.boundary_request is None
    assert head.num_reqs == tail.num_reqs == 2
    assert (np.diff(head.query_start_loc) > 0).all() and (np.diff(tail.query_start_loc) > 0).all()
    assert tail.num_computed_tokens.tolist() == [0, 0]


def test_chunked_request_whose_query_is_part_of_the_prompt():
    # Request 0 is a middle chunk: 2048 cached + 4096 scheduled of a longer prompt.
    _plan, _parent, (head, tail) = split([4096], [2048], SplitConstraints(align=8))
    assert head.num_computed_tokens.tolist() == [2048]
    assert head.seq_lens.tolist() == [2048 + 2048]
    assert tail.num_computed_tokens.tolist() == [4096]
    assert tail.seq_lens.tolist() == [6144]
    assert tail.positions[0] == 4096


def test_mrope_positions_are_sliced_by_token():
    _plan, parent, (head, tail) = split([10, 30], mrope=True)
    assert parent.positions.shape == (3, 40)
    assert head.positions.shape == (3, 20) and tail.positions.shape == (3, 20)
    assert np.array_equal(
        np.concatenate([head.positions, tail.positions], axis=1), parent.positions
    )


def test_parent_is_never_mutated_and_children_are_read_only():
    parent = make([40, 100, 20], [0, 64, 0])
    snapshot = {
        f.name: np.copy(getattr(parent, f.name))
        for f in dataclasses.fields(parent)
        if isinstance(getattr(parent, f.name), np.ndarray)
    }
    plan = plan_split([40, 100, 20], policy=TB)
    parts = split_metadata(plan, parent, validate=True)
    for name, before in snapshot.items():
        assert np.array_equal(getattr(parent, name), before), name
        assert not getattr(parent, name).flags.writeable
    for part in parts:
        for field in dataclasses.fields(part):
            value = getattr(part, field.name)
            if isinstance(value, np.ndarray):
                assert value.dtype == np.int64 and not value.flags.writeable
                with pytest.raises(ValueError, match="read-only"):
                    value[...] = 0


def test_metadata_construction_does_not_freeze_the_callers_arrays():
    qsl = np.array([0, 3])
    meta = BatchMetadata(qsl, [3], [0], [0, 1, 2], [[0]], [0, 1, 2], block_size=4)
    meta.validate()
    assert qsl.flags.writeable and not meta.query_start_loc.flags.writeable


def test_split_rejects_metadata_of_a_different_batch():
    plan = plan_split([10, 10], policy=TB)
    with pytest.raises(ValueError, match="plan was made for"):
        split_metadata(plan, make([10, 11]))
    # Same request and token totals, different request lengths.
    plan = plan_split([4, 16], policy=TB)
    with pytest.raises(ValueError, match="for a different batch"):
        split_metadata(plan, make([16, 4]))


# --- Regressions: each bug seen in other splitters is caught by the invariant checker ---


def naive_split(
    parent, plan, *, adjust_tail_computed=True, keep_positions=True, count_padding=False
):
    """A splitter written like vLLM's, with switches that reproduce its historical bugs."""
    parts = []
    for ub in plan.ubatches:
        t0, t1 = ub.token_slice.start, ub.token_slice.stop
        r0, r1 = ub.request_slice.start, ub.request_slice.stop
        qsl = parent.query_start_loc[r0 : r1 + 1].clip(t0, t1) - t0
        computed = parent.num_computed_tokens[r0:r1].copy()
        if adjust_tail_computed:
            computed[0] += t0 - parent.query_start_loc[r0]
        seq_lens = parent.num_computed_tokens[r0:r1] + np.diff(qsl)
        if ub.index == 1 and not adjust_tail_computed:
            seq_lens = parent.seq_lens[r0:r1].copy()
        elif adjust_tail_computed:
            seq_lens = computed + np.diff(qsl)
        slots = parent.slot_mapping[t0:t1]
        positions = parent.positions[t0:t1] if keep_positions else parent.positions[: t1 - t0]
        if count_padding and ub.num_padded_tokens:
            qsl = qsl.copy()
            qsl[-1] += ub.num_padded_tokens
            seq_lens = seq_lens.copy()
            seq_lens[-1] += ub.num_padded_tokens
            slots = np.concatenate([slots, np.full(ub.num_padded_tokens, -1)])
            positions = np.concatenate([positions, np.zeros(ub.num_padded_tokens, np.int64)])
        parts.append(
            BatchMetadata(
                qsl,
                seq_lens,
                computed,
                slots,
                parent.block_table[r0:r1],
                positions,
                block_size=parent.block_size,
            )
        )
    return parts


@pytest.fixture
def straddling():
    tokens, computed = [40, 100, 20], [0, 64, 0]
    plan = plan_split(tokens, policy=TB, constraints=SplitConstraints(align=8, padded_total=176))
    return plan, make(tokens, computed)


def test_the_naive_splitter_without_bugs_passes(straddling):
    plan, parent = straddling
    validate_split(plan, parent, naive_split(parent, plan))


def test_regression_tail_computed_tokens_not_adjusted(straddling):
    plan, parent = straddling
    _head, tail = naive_split(parent, plan, adjust_tail_computed=False)
    with pytest.raises(
        SplitInvariantError, match="request 0: seq_len 164 - query_len 60 != num_computed_tokens 64"
    ):
        tail.validate()


def test_regression_positions_dropped_or_restarted(straddling):
    plan, parent = straddling
    _head, tail = naive_split(parent, plan, keep_positions=False)
    with pytest.raises(SplitInvariantError, match="position"):
        tail.validate()
    dropped = dataclasses.replace(tail, positions=np.zeros(0, np.int64))
    with pytest.raises(SplitInvariantError, match="positions has shape"):
        dropped.validate()


def test_regression_empty_second_ubatch_and_empty_request_entry():
    parent = make([16, 16])
    empty_tail = BatchMetadata([0], [], [], [], np.zeros((0, 1)), [], block_size=BLOCK)
    with pytest.raises(SplitInvariantError, match="empty batch"):
        empty_tail.validate()
    # A cut on a boundary that still lists the finished request with 0 tokens.
    zero_entry = BatchMetadata(
        [0, 0, 16],
        [16, 16],
        [16, 0],
        parent.slot_mapping[16:],
        parent.block_table,
        parent.positions[16:],
        block_size=BLOCK,
    )
    with pytest.raises(SplitInvariantError, match="request 0: empty request entry"):
        zero_entry.validate()
    # The planner itself never produces either.
    plan = plan_split([16, 16], policy=TB, constraints=SplitConstraints(align=16))
    assert [ub.num_real_tokens for ub in plan.ubatches] == [16, 16]
    assert plan.ubatches[1].request_slice == slice(1, 2)


def test_regression_padding_counted_as_real_work(straddling):
    plan, parent = straddling
    assert plan.ubatches[1].num_padded_tokens == 16
    parts = naive_split(parent, plan, count_padding=True)
    with pytest.raises(SplitInvariantError, match=r"slot -1|position"):
        parts[1].validate()
    with pytest.raises(SplitInvariantError, match="ubatch 1"):
        validate_split(plan, parent, parts)


def test_validate_split_catches_a_tail_not_continuing_the_head(straddling):
    plan, parent = straddling
    head, tail = split_metadata(plan, parent)
    shifted_seq = head.seq_lens.copy()
    shifted_seq[-1] -= 1
    shifted_qsl = head.query_start_loc.copy()
    shifted_qsl[-1] -= 1
    short_head = dataclasses.replace(
        head,
        query_start_loc=shifted_qsl,
        seq_lens=shifted_seq,
        slot_mapping=head.slot_mapping[:-1],
        positions=head.positions[:-1],
    )
    with pytest.raises(SplitInvariantError, match="ubatch 0"):
        validate_split(plan, parent, [short_head, tail])


def test_validate_catches_slot_from_another_requests_block_row():
    meta = make([20, 20])
    wrong = meta.slot_mapping.copy()
    wrong[25] = meta.slot_mapping[5]
    with pytest.raises(SplitInvariantError, match="token 25 \\(request 1\\): slot"):
        dataclasses.replace(meta, slot_mapping=wrong).validate()


# --- merge and gather ---


@pytest.mark.parametrize(
    "constraints",
    [
        SplitConstraints(),
        SplitConstraints(align=8, padded_total=256),
        SplitConstraints(align=4, pcp_size=2),
        SplitConstraints(align=8, pcp_size=4, padded_total=512),
    ],
)
def test_gather_then_merge_restores_logical_order_and_drops_padding(constraints):
    tokens = [37, 5, 90, 11]
    plan = plan_split(tokens, policy=TB, constraints=constraints)
    hidden = np.arange(plan.num_tokens * 3, dtype=np.float32).reshape(plan.num_tokens, 3)
    outputs = [gather_ubatch_rows(plan, i, hidden, pad_value=-1.0) for i in range(2)]
    for ub, rows in zip(plan.ubatches, outputs, strict=False):
        assert rows.shape == (ub.num_rows, 3)
        assert (rows == -1.0).all(axis=1).sum() == ub.num_padded_tokens
    assert np.array_equal(merge_outputs(plan, outputs), hidden)
    tensors = [torch.from_numpy(o) for o in outputs]
    assert torch.equal(merge_outputs(plan, tensors), torch.from_numpy(hidden))
    gathered = gather_ubatch_rows(plan, 1, torch.from_numpy(hidden), pad_value=-1.0)
    assert torch.equal(gathered, tensors[1])


def test_merge_puts_the_head_piece_before_the_tail_piece_of_the_split_request():
    plan = plan_split([10], policy=TB)
    head_out = np.full((5, 1), 0)
    tail_out = np.full((5, 1), 1)
    assert merge_outputs(plan, [head_out, tail_out]).ravel().tolist() == [0] * 5 + [1] * 5


def test_merge_rejects_wrong_row_counts_and_mixed_types():
    plan = plan_split([10], policy=TB, constraints=SplitConstraints(align=4))
    with pytest.raises(ValueError, match="ubatch 1 has 4 rows, expected 8"):
        merge_outputs(plan, [np.zeros(4), np.zeros(4)])
    with pytest.raises(ValueError, match="got 1 outputs for 2"):
        merge_outputs(plan, [np.zeros(4)])
    with pytest.raises(TypeError, match="all as torch"):
        merge_outputs(plan, [np.zeros(4), torch.zeros(8)])
    with pytest.raises(ValueError, match="parent_rows has 3 rows"):
        gather_ubatch_rows(plan, 0, np.zeros(3))


def test_from_requests_rejects_a_too_small_block_table():
    with pytest.raises(ValueError, match="needs 2 blocks"):
        BatchMetadata.from_requests([20], block_table=[[0]], block_size=16)


def test_mrope_image_positions_are_not_mistaken_for_broken_positions():
    meta = make([10, 30], mrope=True)
    image_like = meta.positions.copy()
    image_like[1:, 3:7] = [[0, 0, 1, 1], [0, 1, 0, 1]]  # an image's height/width grid rows
    dataclasses.replace(meta, positions=image_like).validate()
    with pytest.raises(SplitInvariantError, match=r"positions has shape \(3, 39\)"):
        dataclasses.replace(meta, positions=image_like[:, 1:]).validate()
