"""observed_plan: another planner's stages described as a SplitPlan, or refused by name."""

from __future__ import annotations

import pytest

from afd_split.hook.planning.observed_plan import observed_plan
from afd_split.plan.constraints import SplitPolicy
from afd_split.plan.planner import plan_split

COUNTS = [40, 7, 9]


def test_a_request_boundary_split_reads_as_afd_splits_own_plan_of_that_cut():
    observed = observed_plan(COUNTS, [(slice(0, 1), slice(0, 40)), (slice(1, 3), slice(40, 56))],
                             policy=SplitPolicy.REQUEST_BOUNDARY)
    own = plan_split(COUNTS, policy=SplitPolicy.REQUEST_BOUNDARY)
    assert own.split_token == 40  # the same cut, so the evidence must agree field by field
    assert observed.to_evidence() == own.to_evidence()


def test_an_unsplit_step_is_one_ubatch_over_the_parents_rows():
    plan = observed_plan(COUNTS, None, policy=SplitPolicy.NONE, num_input_rows=64)
    evidence = plan.to_evidence()
    assert evidence["is_split"] is False and evidence["num_padded_tokens"] == 8
    assert [u["num_rows"] for u in evidence["ubatches"]] == [64]
    with pytest.raises(ValueError, match="has 50 rows for 56 scheduled tokens"):
        observed_plan(COUNTS, None, policy=SplitPolicy.NONE, num_input_rows=50)


@pytest.mark.parametrize(("stages", "message"), [
    ([(slice(0, 1), slice(0, 40)), (slice(2, 3), slice(47, 56))], "stage 1 starts at request 2"),
    ([(slice(0, 1), slice(0, 41)), (slice(1, 3), slice(41, 56))], "stage 0 holds tokens"),
    ([(slice(0, 1), slice(0, 40)), (slice(1, 2), slice(40, 47))], "the stages end at request 2"),
    ([(slice(0, 3), slice(0, 56))], "1 stages"),
])
def test_stages_that_do_not_add_up_are_refused_by_name(stages, message):
    with pytest.raises(ValueError, match=message):
        observed_plan(COUNTS, stages, policy=SplitPolicy.REQUEST_BOUNDARY)
