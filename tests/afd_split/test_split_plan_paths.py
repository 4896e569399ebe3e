"""The scalar and the vectorised planner build identical plans (or the same error)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from afd_split import SplitConstraints, SplitPolicy, plan_split
from afd_split.plan.constraints import round_up
from afd_split.plan.scalar import SCALAR_PATH_MAX_REQUESTS, plan_scalar, scalar_counts
from afd_split.plan.vector import plan_vectorised

SCALAR_POLICIES = (SplitPolicy.NONE, SplitPolicy.REQUEST_BOUNDARY, SplitPolicy.TOKEN_BALANCED)


def outcome(build):
    """Everything a caller can read from a plan, or the error it raised."""
    try:
        plan = build()
    except ValueError as error:
        return ("error", type(error).__name__, str(error))
    pieces = [
        (
            None if ub.piece_tokens is None else ub.piece_tokens.tolist(),
            None if ub.piece_row_starts is None else ub.piece_row_starts.tolist(),
            ub.real_row_indices.tolist(),
        )
        for ub in plan.ubatches
    ]
    return (
        plan.fingerprint(),
        plan.to_evidence(),
        plan.token_counts.tolist(),
        plan.token_counts.dtype,
        plan.token_counts.flags.writeable,
        plan.num_scheduled_tokens,
        plan.cu_tokens.tolist(),
        pieces,
    )


@st.composite
def planner_inputs(draw):
    tokens = draw(st.lists(st.integers(1, 400), min_size=1, max_size=SCALAR_PATH_MAX_REQUESTS))
    computed = draw(
        st.none() | st.lists(st.integers(0, 5000), min_size=len(tokens), max_size=len(tokens))
    )
    align = draw(st.sampled_from((1, 2, 3, 8, 16, 128)))
    pcp = draw(st.sampled_from((1, 2, 4)))
    min_tokens = draw(st.sampled_from((1, 1, 8, 64)))
    minimum_rows = round_up(sum(tokens), align)
    padded_total = draw(
        st.none()
        | st.integers(minimum_rows // align, minimum_rows // align + 40).map(lambda k: k * align)
        | st.integers(1, 4).map(lambda k: k * align)  # often below the batch: an error
    )
    constraints = SplitConstraints(
        align=align, padded_total=padded_total, min_ubatch_tokens=min_tokens, pcp_size=pcp
    )
    policy = draw(st.sampled_from(SCALAR_POLICIES))
    return tokens, computed, constraints, policy, draw(st.booleans())


@settings(max_examples=400, deadline=None, database=None)
@given(planner_inputs())
def test_scalar_and_vectorised_planners_agree(inputs):
    tokens, computed, constraints, policy, allow_fallback = inputs
    counts = scalar_counts(tokens, 1)
    assert counts is not None
    scalar = outcome(lambda: plan_scalar(policy, counts, constraints, allow_fallback))
    vectorised = outcome(
        lambda: plan_vectorised(policy, np.array(tokens), constraints, allow_fallback, computed)
    )
    assert scalar == vectorised
    # plan_split picks the scalar path here, whichever container the counts come in.
    for container in (list, tuple, np.array):
        through_api = outcome(
            lambda container=container: plan_split(
                container(tokens),
                policy=policy.value,
                constraints=constraints,
                allow_fallback=allow_fallback,
                num_computed_tokens=computed,
            )
        )
        assert through_api == vectorised


@pytest.mark.parametrize(
    "values",
    [
        [True, 2],  # bool is an int subclass: the vectorised path decides (as today)
        [np.int64(3), 4],
        [1.0, 2],
        list(range(1, SCALAR_PATH_MAX_REQUESTS + 2)),
        np.array([[1, 2]]),
        np.array([1.5]),
        [],
        [0, 3],
        "12",
    ],
)
def test_inputs_the_scalar_path_declines_go_to_the_vectorised_path(values):
    assert scalar_counts(values, 1) is None
    assert outcome(lambda: plan_split(values, policy="token_balanced")) == outcome(
        lambda: plan_vectorised(SplitPolicy.TOKEN_BALANCED, values, SplitConstraints(), False, None)
    )
