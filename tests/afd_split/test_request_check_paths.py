"""The request-level check's two comparison paths (Python lists when small, byte ranges when
large) and its engine-dtype use: every single-entry fault is caught on both paths, in int64
and in the engines' int32, and a split of another dtype is named."""

import numpy as np
import pytest

from afd_split import BatchMetadata, SplitConstraints, SplitInvariantError, plan_split
from afd_split.checks.request_checks import LIST_CHECK_MAX_REQUESTS, check_split_arrays
from afd_split.checks.requests import cut_request_arrays, split_request_arrays

SIZES = (3, LIST_CHECK_MAX_REQUESTS, LIST_CHECK_MAX_REQUESTS + 1, 150)
"""Both sides of the list/bytes switch."""


def case(num_requests: int, dtype):
    rng = np.random.default_rng(num_requests)
    tokens = rng.integers(1, 300, num_requests)
    computed = np.where(rng.random(num_requests) < 0.5, rng.integers(1, 500, num_requests), 0)
    meta = BatchMetadata.from_requests(tokens, computed)
    plan = plan_split(tokens, policy="token_balanced", constraints=SplitConstraints(align=4))
    parent = tuple(
        getattr(meta, name).astype(dtype)
        for name in ("query_start_loc", "seq_lens", "num_computed_tokens")
    )
    parts = [tuple(arrays[:3]) for arrays in cut_request_arrays(plan, *parent)]
    return plan, parent, parts


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("num_requests", SIZES)
def test_every_single_entry_fault_is_caught_on_both_paths(num_requests, dtype):
    plan, parent, parts = case(num_requests, dtype)
    assert plan.boundary_request is not None or num_requests == 3
    check_split_arrays(plan, *parent, parts)
    for victim, part in enumerate(parts):
        for field, array in enumerate(part):
            for index in range(array.shape[0]):
                broken = [list(p) for p in parts]
                changed = array.copy()
                changed[index] += 1
                broken[victim][field] = changed
                with pytest.raises(SplitInvariantError):
                    check_split_arrays(plan, *parent, [tuple(p) for p in broken])


@pytest.mark.parametrize("num_requests", SIZES)
def test_parent_faults_are_caught_on_both_paths(num_requests):
    plan, parent, parts = case(num_requests, np.int32)
    for field in range(3):
        for index in (0, parent[field].shape[0] // 2, -1):
            broken = list(parent)
            broken[field] = parent[field].copy()
            broken[field][index] -= 1
            with pytest.raises(SplitInvariantError):
                check_split_arrays(plan, *broken, parts)


@pytest.mark.parametrize("num_requests", SIZES)
def test_a_part_of_another_dtype_is_named(num_requests):
    plan, parent, parts = case(num_requests, np.int32)
    head, tail = parts
    wider = (tail[0], tail[1].astype(np.int64), tail[2])
    with pytest.raises(SplitInvariantError, match=r"^seq_lens: .*dtype int64"):
        check_split_arrays(plan, *parent, [head, wider])


def test_cut_arrays_are_the_read_only_split():
    plan, parent, parts = case(40, np.int64)
    for mine, frozen in zip(parts, split_request_arrays(plan, *parent), strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(mine, frozen, strict=True))
        assert not any(array.flags.writeable for array in frozen)
