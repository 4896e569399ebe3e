"""The plan's records are frozen slotted dataclasses: read-only, identity equality, keyword
construction, ``dataclasses.replace``, pickling, weak references, and caches that stay per
instance."""

import dataclasses
import pickle
import weakref

import numpy as np
import pytest

from afd_split import SplitConstraints, SplitPlan, plan_split
from afd_split.plan.planner import UBatch

SMALL = np.array([40, 7, 90, 3], dtype=np.int64)
LARGE = np.arange(1, 200, dtype=np.int64)


@pytest.fixture(params=["small", "large"])
def plan(request):
    counts = SMALL if request.param == "small" else LARGE
    return plan_split(counts, policy="token_balanced", constraints=SplitConstraints(align=8))


def test_fields_are_read_only(plan):
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.split_token = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.ubatches[0].num_padded_tokens = 0
    # Not a field: slots leave no room for it (Python 3.11's slotted frozen __setattr__
    # raises TypeError here, later ones FrozenInstanceError).
    with pytest.raises((dataclasses.FrozenInstanceError, TypeError, AttributeError)):
        plan.anything_new = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        del plan.policy


def test_equality_is_identity_and_records_do_not_order_or_add(plan):
    twin = dataclasses.replace(plan)
    assert twin is not plan and twin != plan and plan == plan
    assert len({plan, twin}) == 2
    with pytest.raises(TypeError):
        _ = plan < twin
    with pytest.raises(TypeError):
        _ = plan + twin


def test_token_counts_are_a_read_only_int64_array_either_way(plan):
    counts = plan.token_counts
    assert counts.dtype == np.int64 and not counts.flags.writeable
    assert plan.token_counts is counts, "made once, then cached"
    assert plan.num_scheduled_tokens == tuple(counts.tolist())
    assert plan.cu_tokens[-1] == plan.num_tokens


def test_replace_changes_only_the_named_fields(plan):
    head, tail = plan.ubatches
    shorter = dataclasses.replace(tail, num_padded_tokens=tail.num_padded_tokens + 8)
    assert shorter.num_padded_tokens == tail.num_padded_tokens + 8
    assert shorter.token_slice == tail.token_slice and shorter.index == 1
    forged = dataclasses.replace(plan, ubatches=(head, shorter))
    assert forged.ubatches[1] is shorter and forged.split_token == plan.split_token
    with pytest.raises(TypeError, match="cut"):
        dataclasses.replace(plan, cut=3)


def test_keyword_construction_with_defaults_and_named_errors():
    ubatch = UBatch(
        index=0,
        token_slice=slice(0, 8),
        request_slice=slice(0, 1),
        num_real_tokens=8,
        num_padded_tokens=0,
    )
    assert ubatch.piece_tokens is None and ubatch.num_rows == 8
    with pytest.raises(TypeError, match="num_padded_tokens"):
        UBatch(0, slice(0, 8), slice(0, 1), 8)
    with pytest.raises(TypeError, match="bogus"):
        UBatch(0, slice(0, 8), slice(0, 1), 8, 0, bogus=1)
    plan = SplitPlan(
        policy="none",
        token_counts=np.array([8]),
        constraints=SplitConstraints(),
        split_token=None,
        ubatches=(ubatch,),
        boundary_request=None,
        head_tokens=0,
        tail_tokens=0,
    )
    assert plan.fallback_reason is None and not plan.is_split


def test_pickle_round_trip_keeps_every_field(plan):
    copy = pickle.loads(pickle.dumps(plan))
    assert copy.fingerprint() == plan.fingerprint()
    assert copy.to_evidence() == plan.to_evidence()
    assert np.array_equal(copy.ubatches[1].real_row_indices, plan.ubatches[1].real_row_indices)


def test_repr_names_fields_and_hides_arrays(plan):
    text = repr(plan)
    assert text.startswith("SplitPlan(policy=") and "split_token=" in text
    assert "token_counts" not in text and "piece_tokens" not in text


def test_a_plain_subclass_keeps_the_fields():
    class Tagged(UBatch):
        pass

    tagged = Tagged(0, slice(0, 8), slice(0, 1), 8, 0)
    assert tagged.num_rows == 8 and dataclasses.replace(tagged, index=1).index == 1
    assert "Tagged(index=0" in repr(tagged)


def test_records_take_weak_references_and_no_new_attributes(plan):
    """The soak tracks plan lifetimes by weak reference; slots keep instances small."""
    ref = weakref.ref(plan)
    assert ref() is plan
    assert not hasattr(plan, "__dict__")
