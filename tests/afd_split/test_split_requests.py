"""Request-level split fields and their per-step check: every invariant injected and caught."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from afd_split import (
    BatchMetadata,
    RequestFields,
    SplitConstraints,
    SplitInvariantError,
    plan_split,
    split_metadata,
    split_request_fields,
    validate_split_requests,
)
from afd_split.checks.requests import INVARIANTS
from afd_split.plan.scalar import SCALAR_PATH_MAX_REQUESTS

TB = "token_balanced"
# A boundary request (1) cut by the token-balanced split, >= 3 requests in each ubatch.
TOKENS = [30, 20, 100, 20, 30, 40]
COMPUTED = [0, 16, 64, 0, 8, 0]
PADDING_ALIGN = 16
PADDED_TOTAL = 256
MIN_PART_REQUESTS = 3


def setup(tokens=TOKENS, computed=COMPUTED, constraints=None, policy=TB):
    constraints = constraints or SplitConstraints()
    plan = plan_split(tokens, policy=policy, constraints=constraints, num_computed_tokens=computed)
    parent = RequestFields.of(BatchMetadata.from_requests(tokens, computed))
    return plan, parent, split_request_fields(plan, parent)


def with_entry(fields: RequestFields, name: str, index: int, delta: int) -> RequestFields:
    array = np.array(getattr(fields, name))
    array[index] += delta
    return dataclasses.replace(fields, **{name: array})


def expect(invariant: str, plan, parent, parts):
    assert invariant in INVARIANTS
    with pytest.raises(SplitInvariantError, match=f"^{invariant}: ") as caught:
        validate_split_requests(plan, parent, parts)
    return str(caught.value)


def test_request_fields_copy_normalise_and_freeze():
    source = np.array([0, 4, 9], dtype=np.int32)
    fields = RequestFields(source, [4, 5], [0, 0])
    source[1] = 100
    assert fields.query_start_loc.tolist() == [0, 4, 9]  # a copy, not a view
    assert fields.query_start_loc.dtype == np.int64 and not fields.seq_lens.flags.writeable
    assert fields.num_reqs == 2 and fields.num_tokens == 9
    with pytest.raises(ValueError, match="seq_lens must hold integers"):
        RequestFields([0, 1], [1.5], [0])
    with pytest.raises(ValueError, match="num_computed_tokens must be 1-D"):
        RequestFields([0, 1], [1], [[0]])


@pytest.mark.parametrize(
    ("tokens", "computed", "constraints", "policy"),
    [
        (TOKENS, COMPUTED, SplitConstraints(), TB),
        (TOKENS, COMPUTED, SplitConstraints(align=8, padded_total=256), TB),
        ([40, 40, 40, 40], None, SplitConstraints(), "request_boundary"),
        ([2, 2, 4], [0, 3, 1], SplitConstraints(pcp_size=2), TB),
        ([5], [7], SplitConstraints(), TB),
        (TOKENS, COMPUTED, SplitConstraints(), "none"),
    ],
)
def test_request_fields_are_split_metadata_s_and_pass_the_check(
    tokens, computed, constraints, policy
):
    plan, parent, parts = setup(tokens, computed, constraints, policy)
    metadata = BatchMetadata.from_requests(tokens, computed)
    full = split_metadata(plan, metadata, validate=True)
    for fields, part in zip(parts, full, strict=True):
        for name in ("query_start_loc", "seq_lens", "num_computed_tokens"):
            assert np.array_equal(getattr(fields, name), getattr(part, name))
            assert not getattr(fields, name).flags.writeable
    validate_split_requests(plan, parent, parts)
    validate_split_requests(plan, metadata, full)  # BatchMetadata carries the same fields


def test_split_request_fields_refuses_another_batch():
    plan, _, _ = setup()
    other = RequestFields.of(BatchMetadata.from_requests([*TOKENS, 5]))
    with pytest.raises(ValueError, match="plan was made for 6"):
        split_request_fields(plan, other)


def test_query_start_loc_must_start_at_zero_and_end_at_the_real_tokens():
    plan, parent, (head, tail) = setup()
    expect("query_start_loc", plan, parent, [with_entry(head, "query_start_loc", 0, 1), tail])
    message = expect(
        "query_start_loc", plan, parent, [head, with_entry(tail, "query_start_loc", -1, -1)]
    )
    assert "ubatch 1" in message
    message = expect(
        "query_start_loc", plan, parent, [with_entry(head, "query_start_loc", 2, 1), tail]
    )
    assert "ubatch 0 request 2" in message


def test_padding_rows_counted_as_real_tokens_are_caught():
    constraints = SplitConstraints(align=PADDING_ALIGN, padded_total=PADDED_TOTAL)
    plan, parent, (head, tail) = setup(constraints=constraints)
    padding = plan.ubatches[1].num_padded_tokens
    assert padding
    message = expect(
        "padding separation", plan, parent, [head, with_entry(tail, "query_start_loc", -1, padding)]
    )
    assert f"{padding} padding rows" in message


def test_tail_computed_tokens_left_at_the_parent_s_value_is_caught():
    """vLLM's splitter bug: the tail's boundary piece keeps the parent's num_computed_tokens."""
    plan, parent, (head, tail) = setup()
    boundary = plan.boundary_request
    assert boundary is not None
    stale = parent.num_computed_tokens[boundary] - tail.num_computed_tokens[0]
    message = expect(
        "computed tokens", plan, parent, [head, with_entry(tail, "num_computed_tokens", 0, stale)]
    )
    assert "ubatch 1 request 0" in message


def test_head_boundary_piece_keeping_the_parent_s_seq_len_is_caught():
    plan, parent, (head, tail) = setup()
    longer = parent.seq_lens[plan.boundary_request] - head.seq_lens[-1]
    expect("computed tokens", plan, parent, [with_entry(head, "seq_lens", -1, longer), tail])


def test_boundary_piece_that_does_not_continue_the_head_is_caught():
    plan, parent, (head, tail) = setup()
    # The tail's piece is self-consistent (seq and computed both moved) but starts elsewhere.
    shifted = with_entry(with_entry(tail, "num_computed_tokens", 0, 1), "seq_lens", 0, 1)
    expect("boundary continuity", plan, parent, [head, shifted])
    both = [
        with_entry(with_entry(head, "num_computed_tokens", -1, 1), "seq_lens", -1, 1),
        shifted,
    ]
    assert "head num_computed_tokens" in expect("boundary continuity", plan, parent, both)


def test_interior_seq_lens_and_computed_tokens_must_be_the_parent_s():
    plan, parent, (head, tail) = setup()
    assert min(head.num_reqs, tail.num_reqs) >= MIN_PART_REQUESTS
    assert "ubatch 1 request 1" in expect(
        "seq_lens", plan, parent, [head, with_entry(tail, "seq_lens", 1, 1)]
    )
    broken = with_entry(with_entry(head, "num_computed_tokens", 1, 1), "seq_lens", 1, 1)
    expect("seq_lens", plan, parent, [broken, tail])
    expect("computed tokens", plan, parent, [with_entry(head, "num_computed_tokens", 1, 1), tail])
    last = with_entry(with_entry(tail, "num_computed_tokens", -1, 1), "seq_lens", -1, 1)
    assert "tokens left for the next ubatch" in expect("seq_lens", plan, parent, [head, last])


def test_parent_invariants_are_checked():
    plan, parent, parts = setup()
    message = expect("computed tokens", plan, with_entry(parent, "seq_lens", 3, 1), parts)
    assert "parent request 3" in message
    negative = with_entry(with_entry(parent, "num_computed_tokens", 0, -5), "seq_lens", 0, -5)
    assert "< 0" in expect("computed tokens", plan, negative, parts)
    expect("query_start_loc", plan, with_entry(parent, "query_start_loc", 0, -1), parts)


@pytest.mark.parametrize("num_requests", [3, 2 * SCALAR_PATH_MAX_REQUESTS])
def test_parent_checks_on_small_and_large_batches(num_requests):
    """Small batches are checked as Python lists, large ones as arrays: same verdicts."""
    tokens = list(range(5, 5 + num_requests))
    plan, parent, parts = setup(tokens, [7] * num_requests)
    validate_split_requests(plan, parent, parts)
    swapped = tokens[1:2] + tokens[:1] + tokens[2:]  # same R and T, other request lengths
    other = RequestFields.from_requests(swapped, [7] * num_requests)
    assert "parent request 0" in expect("plan mismatch", plan, other, parts)
    broken = with_entry(parent, "seq_lens", 1, 1)
    assert "parent request 1" in expect("computed tokens", plan, broken, parts)
    negative = with_entry(with_entry(parent, "num_computed_tokens", 2, -9), "seq_lens", 2, -9)
    assert "parent request 2: num_computed_tokens -2 < 0" in expect(
        "computed tokens", plan, negative, parts
    )


def test_plan_made_for_other_per_request_tokens_is_refused():
    """Same R and T, other per-request tokens: a PCP plan for [2,2,4] on metadata of [1,3,4]."""
    plan = plan_split([2, 2, 4], policy=TB, constraints=SplitConstraints(pcp_size=2))
    other = RequestFields.of(BatchMetadata.from_requests([1, 3, 4]))
    parts = split_request_fields(plan, other)
    assert "parent request 0" in expect("plan mismatch", plan, other, parts)


def test_a_plan_that_drops_or_overlaps_tokens_is_caught():
    plan, parent, parts = setup()
    head, tail = plan.ubatches
    start = tail.token_slice.start + 1
    dropped = tail.replace(
        token_slice=slice(start, tail.token_slice.stop), num_real_tokens=tail.num_real_tokens - 1
    )
    forged = plan.replace(ubatches=(head, dropped))
    assert "do not continue at token" in expect("token conservation", forged, parent, parts)
    apart = tail.replace(
        request_slice=slice(tail.request_slice.start + 1, tail.request_slice.stop)
    )
    forged = plan.replace(ubatches=(head, apart))
    expect("boundary continuity", forged, parent, parts)


def test_unaligned_or_missing_padding_rows_are_caught():
    plan, parent, parts = setup(constraints=SplitConstraints(align=8, padded_total=256))
    head, tail = plan.ubatches
    short = tail.replace(num_padded_tokens=tail.num_padded_tokens - 8)
    forged = plan.replace(ubatches=(head, short))
    assert "padded_total=256" in expect("padding separation", forged, parent, parts)
    unaligned = head.replace(num_padded_tokens=head.num_padded_tokens + 1)
    forged = plan.replace(ubatches=(unaligned, tail))
    assert "align=8" in expect("padding separation", forged, parent, parts)


def test_wrong_shapes_counts_and_dtypes_are_named():
    plan, parent, (head, tail) = setup()
    expect("shape", plan, parent, [head])
    truncated = dataclasses.replace(tail, seq_lens=tail.seq_lens[:-1])
    assert "seq_lens has shape" in expect("shape", plan, parent, [head, truncated])
    as_int32 = SimpleNamespace(
        query_start_loc=head.query_start_loc.astype(np.int32),
        seq_lens=head.seq_lens,
        num_computed_tokens=head.num_computed_tokens,
    )
    assert "dtype int32" in expect("query_start_loc", plan, parent, [as_int32, tail])


@settings(max_examples=150, deadline=None, database=None)
@given(
    tokens=st.lists(st.integers(1, 300), min_size=1, max_size=2 * SCALAR_PATH_MAX_REQUESTS),
    align=st.sampled_from((1, 4, 8)),
    pcp=st.sampled_from((1, 2)),
    data=st.data(),
)
def test_any_single_entry_off_by_any_amount_is_caught(tokens, align, pcp, data):
    computed = data.draw(st.lists(st.integers(0, 500), min_size=len(tokens), max_size=len(tokens)))
    constraints = SplitConstraints(align=align, pcp_size=pcp)
    plan = plan_split(
        tokens,
        policy=TB,
        constraints=constraints,
        num_computed_tokens=computed,
        allow_fallback=True,
    )
    parent = RequestFields.of(BatchMetadata.from_requests(tokens, computed))
    parts = split_request_fields(plan, parent)
    validate_split_requests(plan, parent, parts)
    victim = data.draw(st.integers(0, len(parts) - 1))
    name = data.draw(st.sampled_from(("query_start_loc", "seq_lens", "num_computed_tokens")))
    index = data.draw(st.integers(0, getattr(parts[victim], name).size - 1))
    delta = data.draw(st.integers(-50, 50).filter(bool))
    parts[victim] = with_entry(parts[victim], name, index, delta)
    with pytest.raises(SplitInvariantError):
        validate_split_requests(plan, parent, parts)
