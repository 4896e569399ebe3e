"""Focused tests of plan_split: the RFC's required cases, padding, PCP, rejection, evidence."""

import json

import numpy as np
import pytest

from afd_split import (
    SplitConstraints,
    SplitPolicy,
    SplitRejectedError,
    plan_split,
)

TB = SplitPolicy.TOKEN_BALANCED
RB = SplitPolicy.REQUEST_BOUNDARY


def real_tokens(plan):
    return [ub.num_real_tokens for ub in plan.ubatches]


def test_one_long_request_is_split_in_half_across_both_ubatches():
    plan = plan_split([10_000], policy=TB, constraints=SplitConstraints(align=8))
    assert plan.is_split and plan.split_token == 5000
    assert plan.boundary_request == 0
    assert (plan.head_tokens, plan.tail_tokens) == (5000, 5000)
    head, tail = plan.ubatches
    assert head.request_slice == slice(0, 1) and tail.request_slice == slice(0, 1)
    assert head.token_slice == slice(0, 5000) and tail.token_slice == slice(5000, 10_000)


def test_request_boundary_cannot_split_one_long_request():
    with pytest.raises(SplitRejectedError, match="1 request"):
        plan_split([10_000], policy=RB)
    fallback = plan_split([10_000], policy=RB, allow_fallback=True)
    assert not fallback.is_split and "1 request" in fallback.fallback_reason
    assert real_tokens(fallback) == [10_000]


def test_equal_requests_split_on_the_middle_boundary_without_boundary_request():
    plan = plan_split([512] * 4, policy=TB, constraints=SplitConstraints(align=8))
    assert plan.split_token == 1024
    assert plan.boundary_request is None and plan.head_tokens == plan.tail_tokens == 0
    head, tail = plan.ubatches
    # A cut exactly on a boundary puts no request in both ubatches (no empty entry).
    assert head.request_slice == slice(0, 2) and tail.request_slice == slice(2, 4)


def test_unequal_requests_token_split_beats_request_boundary():
    tokens = [4096, 120, 7000]
    token = plan_split(tokens, policy=TB, constraints=SplitConstraints(align=8))
    boundary = plan_split(tokens, policy=RB, constraints=SplitConstraints(align=8))
    assert real_tokens(token) == [5608, 5608]
    assert real_tokens(boundary) == [4216, 7000]
    assert token.imbalance == 0.0 and boundary.imbalance > 0.24


@pytest.mark.parametrize(
    ("tokens", "expected_cut"),
    [
        # cu = 2, 4, 8; |2cu - T| = 6, 2, 6 -> 4.
        ([2, 2, 4, 2], 4),
        # cu = 1, 2, 3, 5, 7 (T = 8); 3 and 5 tie on tokens; 3 | 3 requests beats 4 | 2.
        ([1, 1, 1, 2, 2, 1], 3),
        # cu = 1, 5, 7, 11 (T = 12); 5 (2 | 3) and 7 (3 | 2) tie on tokens and on request
        # balance; the smaller head wins.
        ([1, 4, 2, 4, 1], 5),
        # One giant first request: the only boundary is after it.
        ([100, 1], 100),
    ],
)
def test_request_boundary_picks_best_boundary_then_request_balance(tokens, expected_cut):
    plan = plan_split(tokens, policy=RB)
    assert plan.split_token == expected_cut
    assert plan.boundary_request is None


def test_token_balanced_tie_goes_to_the_larger_cut():
    # T = 24, align = 8: cuts 8 and 16 are both 8 away from 12... |2s-T| = 8 for both.
    plan = plan_split([24], policy=TB, constraints=SplitConstraints(align=8))
    assert plan.split_token == 16


def test_prefix_hit_and_chunked_requests_keep_their_computed_counts_out_of_the_split():
    # Computed tokens change seq_lens, not the scheduled interval being split.
    tokens = [300, 2000, 50]
    with_hits = plan_split(tokens, policy=TB, num_computed_tokens=[1024, 4096, 0])
    without = plan_split(tokens, policy=TB)
    assert with_hits.split_token == without.split_token == 1175
    assert with_hits.boundary_request == 1


def test_sp_padding_goes_to_the_tail_only_and_is_not_real():
    plan = plan_split([100, 37], policy=TB, constraints=SplitConstraints(align=8, padded_total=160))
    head, tail = plan.ubatches
    assert plan.split_token == 72  # 137 / 2 = 68.5 -> nearest multiple of 8 is 72 (vs 64)
    assert (head.num_real_tokens, head.num_padded_tokens) == (72, 0)
    assert (tail.num_real_tokens, tail.num_padded_tokens) == (65, 23)
    assert head.num_rows % 8 == 0 and tail.num_rows % 8 == 0
    assert sum(real_tokens(plan)) == 137 and plan.num_rows == 160


def test_default_rows_round_the_batch_up_to_align():
    plan = plan_split([101], policy=TB, constraints=SplitConstraints(align=4))
    assert plan.num_rows == 104
    assert plan.ubatches[1].num_padded_tokens == 3


@pytest.mark.parametrize(
    ("tokens", "constraints", "reason"),
    [
        ([8], SplitConstraints(align=8), "empty tail"),
        ([5, 3], SplitConstraints(align=16), "empty tail"),
        ([12], SplitConstraints(align=8, min_ubatch_tokens=8), "padding-only"),
        ([30], SplitConstraints(min_ubatch_tokens=16), "min_ubatch_tokens=16"),
    ],
)
def test_empty_or_padding_only_tail_is_rejected_with_a_reason(tokens, constraints, reason):
    with pytest.raises(SplitRejectedError, match=reason):
        plan_split(tokens, policy=TB, constraints=constraints)
    fallback = plan_split(tokens, policy=TB, constraints=constraints, allow_fallback=True)
    assert not fallback.is_split and reason in fallback.fallback_reason
    assert fallback.to_evidence()["fallback_reason"] == fallback.fallback_reason


def test_naive_half_of_padded_total_would_leave_a_padding_only_tail_but_plan_does_not():
    # vLLM-style cut at padded_total // 2 = 32 would leave the 10 real tokens all in the head.
    plan = plan_split([10], policy=TB, constraints=SplitConstraints(align=2, padded_total=64))
    head, tail = plan.ubatches
    assert head.num_real_tokens == 6 and tail.num_real_tokens == 4
    assert tail.num_padded_tokens == 64 - 10 and head.num_padded_tokens == 0


def test_pcp_pads_each_request_piece_to_twice_pcp_after_the_split():
    plan = plan_split([10, 7, 30], policy=TB, constraints=SplitConstraints(align=2, pcp_size=2))
    head, tail = plan.ubatches
    assert plan.split_token == 24 and plan.boundary_request == 2
    # head pieces 10, 7, 7 -> rows 12, 8, 8; tail piece 23 -> 24.
    assert head.piece_tokens.tolist() == [10, 7, 7]
    assert head.piece_row_starts.tolist() == [0, 12, 20]
    assert head.num_rows == 28 and tail.num_rows == 24
    assert head.real_row_indices[:12].tolist() == [*range(10), 12, 13]
    assert tail.real_row_indices.tolist() == list(range(23))
    for ub in plan.ubatches:
        starts = ub.piece_row_starts
        assert all(start % 4 == 0 for start in starts.tolist())
        assert len(set(ub.real_row_indices.tolist())) == ub.num_real_tokens


def test_pcp_fails_closed_when_padded_total_cannot_hold_per_request_padding():
    constraints = SplitConstraints(align=2, pcp_size=4, padded_total=48)
    with pytest.raises(SplitRejectedError, match="pcp_size=4"):
        plan_split([5, 5, 5, 5, 5, 5, 5], policy=TB, constraints=constraints)


def test_request_boundary_cut_off_alignment_pads_the_head_per_ubatch():
    plan = plan_split([5, 9], policy=RB, constraints=SplitConstraints(align=4))
    head, tail = plan.ubatches
    assert (head.num_real_tokens, head.num_padded_tokens) == (5, 3)
    assert (tail.num_real_tokens, tail.num_padded_tokens) == (9, 3)


def test_policy_none_runs_the_whole_batch_as_one_padded_ubatch():
    plan = plan_split([3, 4], policy="none", constraints=SplitConstraints(align=4))
    assert not plan.is_split and plan.fallback_reason is None
    (only,) = plan.ubatches
    assert only.token_slice == slice(0, 7) and only.request_slice == slice(0, 2)
    assert (only.num_real_tokens, only.num_padded_tokens) == (7, 1)
    assert plan.to_evidence()["imbalance"] is None


def test_evidence_is_json_and_reports_realized_tokens():
    plan = plan_split([4096, 120, 7000], policy=TB, constraints=SplitConstraints(align=8))
    evidence = json.loads(json.dumps(plan.to_evidence()))
    assert evidence["policy"] == "token_balanced" and evidence["split_token"] == 5608
    assert [u["num_real_tokens"] for u in evidence["ubatches"]] == [5608, 5608]
    assert [u["num_padded_tokens"] for u in evidence["ubatches"]] == [0, 0]
    assert evidence["imbalance"] == 0.0 and evidence["boundary_request"] == 2


def test_fingerprint_is_stable_and_sensitive_to_inputs_and_decision():
    tokens = np.array([4096, 120, 7000])
    a = plan_split(tokens, policy=TB, constraints=SplitConstraints(align=8))
    b = plan_split(tokens.tolist(), policy="token_balanced", constraints=SplitConstraints(align=8))
    c = plan_split(tokens.astype(np.int32), policy=TB, constraints=SplitConstraints(align=8))
    assert a.fingerprint() == c.fingerprint()
    assert a.fingerprint() == b.fingerprint()
    assert a.fingerprint() != plan_split(tokens, policy=RB).fingerprint()
    assert (
        a.fingerprint()
        != plan_split(
            [4096, 121, 6999], policy=TB, constraints=SplitConstraints(align=8)
        ).fingerprint()
    )
    assert (
        a.fingerprint()
        != plan_split(tokens, policy=TB, constraints=SplitConstraints(align=16)).fingerprint()
    )


def test_plan_does_not_mutate_or_alias_writable_input():
    tokens = np.array([5, 6, 7], dtype=np.int64)
    plan = plan_split(tokens, policy=TB)
    assert tokens.flags.writeable
    assert not plan.token_counts.flags.writeable
    assert plan.num_scheduled_tokens == (5, 6, 7)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_scheduled_tokens": [3, -1]}, r"num_scheduled_tokens\[1\]=-1"),
        ({"num_scheduled_tokens": [3, 0]}, r"num_scheduled_tokens\[1\]=0"),
        ({"num_scheduled_tokens": []}, "non-empty"),
        ({"num_scheduled_tokens": [[1, 2]]}, "1-D"),
        ({"num_scheduled_tokens": [1.5, 2]}, "integers"),
        ({"num_scheduled_tokens": [3, 4], "num_computed_tokens": [1]}, "1 entries"),
        ({"num_scheduled_tokens": [3, 4], "num_computed_tokens": [0, -2]}, r"\[1\]=-2"),
        ({"num_scheduled_tokens": [3, 4], "policy": "halves"}, "halves"),
    ],
)
def test_bad_input_names_the_bad_value(kwargs, match):
    kwargs.setdefault("policy", TB)
    tokens = kwargs.pop("num_scheduled_tokens")
    with pytest.raises(ValueError, match=match):
        plan_split(tokens, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"align": 0}, "align must be an integer >= 1, got 0"),
        ({"pcp_size": -2}, "pcp_size"),
        ({"min_ubatch_tokens": 0}, "min_ubatch_tokens"),
        ({"align": 8, "padded_total": 20}, "not a multiple of align=8"),
        ({"padded_total": 0}, "padded_total"),
    ],
)
def test_bad_constraints_are_rejected_on_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SplitConstraints(**kwargs)


def test_padded_total_below_the_aligned_batch_is_rejected():
    with pytest.raises(ValueError, match="padded_total=8 is below"):
        plan_split([9], policy=TB, constraints=SplitConstraints(align=4, padded_total=8))


@pytest.mark.parametrize(
    "plan",
    [
        plan_split([4096, 120, 7000], policy=TB, constraints=SplitConstraints(align=8)),
        plan_split([5, 9], policy=RB, constraints=SplitConstraints(align=4, pcp_size=2)),
        plan_split([8], policy=TB, constraints=SplitConstraints(align=8), allow_fallback=True),
        plan_split([3, 4], policy="none"),
    ],
    ids=["token", "boundary-pcp", "fallback", "none"],
)
def test_evidence_validates_against_the_result_schema_step(plan):
    import pathlib

    import jsonschema

    schema_path = pathlib.Path(__file__).resolve().parents[2] / "schemas/result.schema.json"
    schema = json.loads(schema_path.read_text())
    step = {"$ref": "#/$defs/step", "$defs": schema["$defs"]}
    jsonschema.Draft202012Validator(step).validate(json.loads(json.dumps(plan.to_evidence())))


def test_every_splitting_policy_has_a_cut_selector():
    from afd_split.plan.policies import CUT_SELECTORS

    assert set(CUT_SELECTORS) == set(SplitPolicy) - {SplitPolicy.NONE}
    with pytest.raises(TypeError):
        CUT_SELECTORS[SplitPolicy.NONE] = None  # the table is read-only
