"""Hypothesis properties over random batches: conservation, order, invariants, optimality."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from afd_split import SplitConstraints, SplitPolicy, SplitRejectedError, plan_split
from afd_split.checks.metadata import BatchMetadata, split_metadata
from afd_split.engine.rows import gather_ubatch_rows, merge_outputs

MAX_REQUESTS = 4096
MAX_TOKENS = 140_000
ALIGNS = (1, 2, 3, 4, 8, 16, 128)
PCP_SIZES = (1, 1, 2, 4, 8)

PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
BRUTE_FORCE_SETTINGS = settings(max_examples=200, deadline=None, database=None)


@st.composite
def batches(draw, max_requests=MAX_REQUESTS, max_tokens=MAX_TOKENS):
    """Per-request scheduled / computed tokens; Dirichlet skew from flat to one dominant request."""
    num_requests = draw(st.integers(1, max_requests))
    total = draw(st.integers(num_requests, max(num_requests, max_tokens)))
    concentration = draw(st.sampled_from((0.05, 0.5, 1.0, 20.0)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weights = rng.dirichlet(np.full(num_requests, concentration))
    tokens = 1 + rng.multinomial(total - num_requests, weights)
    has_hits = draw(st.booleans())
    computed = rng.integers(0, 5000, num_requests) * rng.integers(0, 2, num_requests)
    return tokens, (computed if has_hits else np.zeros(num_requests, np.int64))


@st.composite
def constraints_for(draw, num_tokens):
    align = draw(st.sampled_from(ALIGNS))
    pcp = draw(st.sampled_from(PCP_SIZES))
    min_tokens = draw(st.sampled_from((1, 1, 2, 7, 64)))
    padded_total = None
    if draw(st.booleans()):
        extra = draw(st.integers(0, 3)) * align
        pcp_room = 0 if pcp == 1 else 2 * (2 * pcp) * num_tokens  # generous, may still reject
        base = -(-num_tokens // align) * align
        padded_total = base + extra + (-(-pcp_room // align) * align if draw(st.booleans()) else 0)
    return SplitConstraints(
        align=align, padded_total=padded_total, min_ubatch_tokens=min_tokens, pcp_size=pcp
    )


def check_plan_structure(plan, tokens, constraints):
    total = int(tokens.sum())
    cu = np.concatenate([[0], np.cumsum(tokens)])
    assert sum(ub.num_real_tokens for ub in plan.ubatches) == total
    assert plan.ubatches[0].token_slice.start == 0
    assert plan.ubatches[-1].token_slice.stop == total
    for ub in plan.ubatches:
        t0, t1 = ub.token_slice.start, ub.token_slice.stop
        r0, r1 = ub.request_slice.start, ub.request_slice.stop
        assert ub.num_real_tokens == t1 - t0 > 0
        assert ub.num_padded_tokens >= 0 and ub.num_rows % constraints.align == 0
        # request slice = exactly the requests overlapping the token slice
        assert cu[r0] <= t0 < cu[r0 + 1] and cu[r1 - 1] < t1 <= cu[r1]
        rows = ub.real_row_indices
        assert len(rows) == ub.num_real_tokens and (np.diff(rows) > 0).all()
        assert rows[-1] < ub.num_rows
        if constraints.pcp_size > 1:
            assert (ub.piece_row_starts % (2 * constraints.pcp_size) == 0).all()
            assert int(ub.piece_tokens.sum()) == ub.num_real_tokens
    if constraints.padded_total is not None:
        assert plan.num_rows == constraints.padded_total
    if plan.is_split:
        head, tail = plan.ubatches
        assert head.token_slice.stop == tail.token_slice.start == plan.split_token
        assert head.num_real_tokens >= constraints.min_ubatch_tokens
        assert tail.num_real_tokens >= constraints.min_ubatch_tokens
        if plan.boundary_request is None:
            assert head.request_slice.stop == tail.request_slice.start
            assert plan.split_token in cu
        else:
            assert head.request_slice.stop - 1 == tail.request_slice.start == plan.boundary_request
            assert plan.head_tokens + plan.tail_tokens == tokens[plan.boundary_request]
            assert plan.head_tokens > 0 and plan.tail_tokens > 0
        if constraints.pcp_size == 1:
            assert head.num_padded_tokens == (
                0 if plan.policy is SplitPolicy.TOKEN_BALANCED else head.num_padded_tokens
            )


@pytest.mark.parametrize("policy", [SplitPolicy.TOKEN_BALANCED, SplitPolicy.REQUEST_BOUNDARY])
@PROPERTY_SETTINGS
@given(data=st.data())
def test_random_batches_conserve_tokens_and_keep_every_invariant(policy, data):
    tokens, computed = data.draw(batches())
    constraints = data.draw(constraints_for(int(tokens.sum())))
    try:
        plan = plan_split(
            tokens, policy=policy, constraints=constraints, num_computed_tokens=computed
        )
    except SplitRejectedError:
        try:
            plan = plan_split(
                tokens,
                policy=policy,
                constraints=constraints,
                num_computed_tokens=computed,
                allow_fallback=True,
            )
        except SplitRejectedError as error:
            # Only PCP padding can make even the unsplit batch not fit padded_total.
            assert constraints.pcp_size > 1 and "rows" in str(error)
            return
        assert plan.fallback_reason
    check_plan_structure(plan, tokens, constraints)
    parent = BatchMetadata.from_requests(tokens, computed, block_size=128)
    parts = split_metadata(plan, parent, validate=True)
    assert sum(p.num_reqs for p in parts) == tokens.size + (plan.boundary_request is not None)
    rows = np.arange(plan.num_tokens)
    outputs = [gather_ubatch_rows(plan, i, rows, pad_value=-1) for i in range(len(parts))]
    assert np.array_equal(merge_outputs(plan, outputs), rows)


def brute_force_token_cut(total, constraints):
    candidates = [
        s
        for s in range(1, total)
        if s % constraints.align == 0
        and s >= constraints.min_ubatch_tokens
        and total - s >= constraints.min_ubatch_tokens
    ]
    return min(candidates, key=lambda s: (abs(2 * s - total), -s)) if candidates else None


@BRUTE_FORCE_SETTINGS
@given(
    tokens=st.lists(st.integers(1, 60), min_size=1, max_size=12),
    align=st.integers(1, 24),
    min_tokens=st.integers(1, 20),
    pcp=st.sampled_from(PCP_SIZES),
)
def test_token_balanced_cut_is_optimal_against_brute_force(tokens, align, min_tokens, pcp):
    constraints = SplitConstraints(align=align, min_ubatch_tokens=min_tokens, pcp_size=pcp)
    expected = brute_force_token_cut(sum(tokens), constraints)
    if expected is None:
        with pytest.raises(SplitRejectedError):
            plan_split(tokens, policy="token_balanced", constraints=constraints)
        return
    plan = plan_split(tokens, policy="token_balanced", constraints=constraints)
    assert plan.split_token == expected
    check_plan_structure(plan, np.asarray(tokens), constraints)


@BRUTE_FORCE_SETTINGS
@given(tokens=st.lists(st.integers(1, 60), min_size=1, max_size=12), min_tokens=st.integers(1, 40))
def test_request_boundary_cut_is_optimal_against_brute_force(tokens, min_tokens):
    total, count = sum(tokens), len(tokens)
    cu = np.cumsum(tokens)
    candidates = [
        (abs(2 * int(cu[k]) - total), abs(2 * (k + 1) - count), k + 1, int(cu[k]))
        for k in range(count - 1)
        if cu[k] >= min_tokens and total - cu[k] >= min_tokens
    ]
    constraints = SplitConstraints(min_ubatch_tokens=min_tokens)
    if not candidates:
        with pytest.raises(SplitRejectedError):
            plan_split(tokens, policy="request_boundary", constraints=constraints)
        return
    plan = plan_split(tokens, policy="request_boundary", constraints=constraints)
    assert plan.split_token == min(candidates)[3]
    assert plan.boundary_request is None


@BRUTE_FORCE_SETTINGS
@given(
    tokens=st.lists(st.integers(1, 3000), min_size=1, max_size=16), align=st.sampled_from(ALIGNS)
)
def test_token_split_never_worse_than_request_boundary(tokens, align):
    constraints = SplitConstraints(align=1)
    token = plan_split(
        tokens, policy="token_balanced", constraints=constraints, allow_fallback=True
    )
    boundary = plan_split(
        tokens, policy="request_boundary", constraints=constraints, allow_fallback=True
    )
    if boundary.is_split:
        assert token.imbalance <= boundary.imbalance
    aligned = plan_split(
        tokens,
        policy="token_balanced",
        constraints=SplitConstraints(align=align),
        allow_fallback=True,
    )
    if aligned.is_split:
        head, tail = aligned.ubatches
        assert abs(head.num_real_tokens - tail.num_real_tokens) <= align


@pytest.mark.parametrize("policy", [SplitPolicy.TOKEN_BALANCED, SplitPolicy.REQUEST_BOUNDARY])
@pytest.mark.parametrize("seed", [0, 1])
def test_largest_batches_keep_every_invariant(policy, seed):
    """Hypothesis favours small sizes; pin the issue's upper bounds explicitly."""
    rng = np.random.default_rng(seed)
    tokens = 1 + rng.multinomial(
        MAX_TOKENS - MAX_REQUESTS, rng.dirichlet(np.full(MAX_REQUESTS, 0.3))
    )
    computed = rng.integers(0, 5000, MAX_REQUESTS)
    constraints = SplitConstraints(align=8, pcp_size=2 * (seed + 1))
    plan = plan_split(tokens, policy=policy, constraints=constraints, num_computed_tokens=computed)
    assert plan.is_split
    check_plan_structure(plan, tokens, constraints)
    parent = BatchMetadata.from_requests(tokens, computed, block_size=128)
    split_metadata(plan, parent, validate=True)
    if policy is SplitPolicy.TOKEN_BALANCED:
        assert plan.imbalance <= 8 / MAX_TOKENS
