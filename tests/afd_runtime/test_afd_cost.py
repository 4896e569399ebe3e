"""Cost model and the cost_balanced cut selector (pure numpy, fast)."""

import itertools

import numpy as np
import pytest

from afd_split import SplitConstraints, SplitRejectedError
from afd_split.plan.cost import (
    MIN_MODELLED_GAIN,
    CostModel,
    StageSample,
    attended_keys_per_row,
    fit_cost_model,
    modelled_plan_cost,
    select_cost_balanced_cut,
    two_stage_makespan,
    use_cost_model,
)

ATTENTION_HEAVY = CostModel(
    attention_per_token_s=1e-6,
    attention_per_key_s=1e-7,
    expert_per_token_s=1e-6,
    num_moe_layers=4,
)


DEFAULT_CONSTRAINTS = SplitConstraints()


def _select(tokens, computed=None, constraints=DEFAULT_CONSTRAINTS):
    tokens = np.asarray(tokens)
    return select_cost_balanced_cut(
        tokens, tokens.cumsum(), constraints, None if computed is None else np.asarray(computed)
    )


def _simulate(attention, ffn, layers):
    """Event-by-event reference of the two-stage schedule (scalar, obviously correct)."""
    attention_free = ffn_free = 0.0
    expert_done = [0.0] * len(attention)
    for _ in range(layers):
        for u in range(len(attention)):
            start = max(attention_free, expert_done[u])
            attention_free = start + attention[u]
            ffn_free = max(ffn_free, attention_free) + ffn[u]
            expert_done[u] = ffn_free
    return max([attention_free, *expert_done])


def test_attended_keys_count_causal_context_and_cap():
    keys = attended_keys_per_row(np.array([3, 2]), np.array([0, 5]), None)
    assert keys.tolist() == [1, 2, 3, 6, 7]
    assert attended_keys_per_row(np.array([3, 2]), np.array([0, 5]), 4).tolist() == [1, 2, 3, 4, 4]


def test_attended_keys_reject_mismatched_computed():
    with pytest.raises(ValueError, match="num_computed_tokens has shape"):
        attended_keys_per_row(np.array([3, 2]), np.array([0]), None)


@pytest.mark.parametrize("layers", [1, 3])
def test_vectorised_makespan_matches_scalar_schedule(layers):
    rng = np.random.default_rng(layers)
    for _ in range(20):
        a0, a1, f0, f1 = rng.uniform(0.1, 2.0, size=4)
        got = two_stage_makespan([np.array([a0]), np.array([a1])], [np.array([f0]), np.array([f1])], layers)
        assert got[0] == pytest.approx(_simulate([a0, a1], [f0, f1], layers))


def test_unsplit_makespan_is_serial_sum():
    got = two_stage_makespan([np.array([2.0])], [np.array([3.0])], 4)
    assert got[0] == pytest.approx(4 * 5.0)


def test_split_overlaps_stages():
    unsplit = two_stage_makespan([np.array([2.0])], [np.array([2.0])], 8)[0]
    split = two_stage_makespan([np.array([1.0])] * 2, [np.array([1.0])] * 2, 8)[0]
    assert split < 0.6 * unsplit


def test_cost_balanced_is_the_exhaustive_optimum():
    tokens = np.array([7, 30, 5, 12])
    computed = np.array([0, 40, 0, 3])
    model = CostModel(
        attention_per_token_s=2e-6, attention_per_key_s=5e-8, expert_per_token_s=3e-6,
        attention_fixed_s=1e-5, num_moe_layers=3,
    )
    with use_cost_model(model):
        cut = _select(tokens, computed)
    costs = {c: modelled_plan_cost(model, tokens, computed, c)["makespan_s"] for c in range(1, 54)}
    best = min(costs.values())
    balanced_cut = 27  # nearest to T/2 = 27, ties upward
    if costs[balanced_cut] * (1 - MIN_MODELLED_GAIN) < best:
        assert cut == balanced_cut
    else:
        assert costs[cut] == pytest.approx(best)
        assert cut == max(c for c, v in costs.items() if v == pytest.approx(best))


def test_cost_balanced_shortens_an_attention_heavy_head():
    # Attention and experts of similar size; the first request reads a long cached
    # context, so token-equal halves leave the head's attention far heavier. The
    # cost-balanced cut gives the head fewer tokens and models a shorter makespan.
    model = CostModel(
        attention_per_token_s=1e-6, attention_per_key_s=2e-9, expert_per_token_s=4e-6,
        num_moe_layers=4,
    )
    tokens = np.array([64, 16, 16, 16, 16])
    computed = np.array([2000, 0, 0, 0, 0])
    with use_cost_model(model):
        cut = _select(tokens, computed)
    half = int(tokens.sum()) // 2
    assert cut < half
    chosen = modelled_plan_cost(model, tokens, computed, cut)["makespan_s"]
    token_balanced = modelled_plan_cost(model, tokens, computed, half)["makespan_s"]
    assert chosen < 0.95 * token_balanced


def test_flat_objective_keeps_the_token_balanced_cut():
    # FFN-bound: every cut models within a fraction of a percent, so model error
    # would decide; the policy keeps token_balanced's cut.
    model = CostModel(attention_per_token_s=1e-7, attention_per_key_s=0.0, expert_per_token_s=1e-4,
                      attention_fixed_s=1e-3, num_moe_layers=7)
    with use_cost_model(model):
        assert _select([192] * 8) == 768


def test_attention_bound_batch_keeps_token_balanced_unless_the_gain_is_real():
    # When attention dominates, total attention is fixed and only the last
    # ubatch's expert stage is exposed: the modelled optimum lies right of T/2
    # but gains < MIN_MODELLED_GAIN, so the token-balanced cut stays.
    tokens = np.array([64, 16, 16, 16, 16])
    computed = np.array([4000, 0, 0, 0, 0])
    costs = {c: modelled_plan_cost(ATTENTION_HEAVY, tokens, computed, c)["makespan_s"]
             for c in range(1, 128)}
    assert min(costs, key=costs.get) > 64
    with use_cost_model(ATTENTION_HEAVY):
        assert _select(tokens, computed) == 64


def test_cost_balanced_equals_token_balanced_when_keys_are_free():
    flat = CostModel(attention_per_token_s=1e-6, attention_per_key_s=0.0, expert_per_token_s=1e-6)
    with use_cost_model(flat):
        assert _select([10, 10, 10, 10]) == 20


def test_cost_balanced_honours_alignment_and_min_tokens():
    constraints = SplitConstraints(align=8, min_ubatch_tokens=16)
    tokens = [200, 8, 8, 8]
    with use_cost_model(ATTENTION_HEAVY):
        cut = _select(tokens, [0, 0, 0, 0], constraints)
    assert cut % 8 == 0
    assert 16 <= cut <= sum(tokens) - 16


def test_cost_balanced_rejects_impossible_split():
    with pytest.raises(SplitRejectedError, match="align=8"):
        _select([4, 3], constraints=SplitConstraints(align=8))


def test_fit_recovers_coefficients():
    truth = CostModel(
        attention_per_token_s=3e-6, attention_per_key_s=2e-8, expert_per_token_s=5e-6,
        attention_fixed_s=1e-4, expert_fixed_s=2e-4, transfer_per_token_s=1e-7,
    )
    samples = []
    for rows, keys in itertools.product([50, 200, 400], [1_000, 20_000, 90_000]):
        samples.append(StageSample(
            num_rows=rows, num_keys=keys,
            attention_s=truth.attention_fixed_s + truth.attention_per_token_s * rows
            + truth.attention_per_key_s * keys,
            expert_s=truth.expert_fixed_s + truth.expert_per_token_s * rows,
            transfer_s=truth.transfer_per_token_s * rows,
        ))
    fitted = fit_cost_model(samples, num_moe_layers=7)
    for name in ("attention_per_token_s", "attention_per_key_s", "expert_per_token_s",
                 "attention_fixed_s", "expert_fixed_s", "transfer_per_token_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    assert fitted.num_moe_layers == 7


def test_fit_never_returns_negative_coefficients():
    samples = [StageSample(n, 10 * n, 1e-3 - 1e-6 * n, 1e-3) for n in (10, 20, 40, 80)]
    fitted = fit_cost_model(samples, num_moe_layers=1)
    assert min(fitted.attention_per_token_s, fitted.attention_per_key_s, fitted.expert_per_token_s) >= 0


def test_bad_cost_model_values_are_named():
    with pytest.raises(ValueError, match="attention_per_key_s"):
        CostModel(attention_per_token_s=1.0, attention_per_key_s=-1.0, expert_per_token_s=1.0)
    with pytest.raises(ValueError, match="needs >= 3 samples"):
        fit_cost_model([StageSample(1, 1, 1.0, 1.0)], num_moe_layers=1)
    with pytest.raises(TypeError, match="CostModel"):
        with use_cost_model({"attention_per_token_s": 1.0}):
            pass


def test_plan_split_dispatches_cost_balanced_and_records_policy():
    from afd_split import SplitPolicy, plan_split

    model = CostModel(
        attention_per_token_s=1e-6, attention_per_key_s=2e-9, expert_per_token_s=4e-6,
        num_moe_layers=4,
    )
    with use_cost_model(model):
        plan = plan_split([64, 16, 16, 16, 16], policy="cost_balanced",
                          num_computed_tokens=[2000, 0, 0, 0, 0])
    assert plan.policy is SplitPolicy.COST_BALANCED
    assert plan.to_evidence()["policy"] == "cost_balanced"
    assert plan.split_token == _select_with(model, [64, 16, 16, 16, 16], [2000, 0, 0, 0, 0])
    assert plan.boundary_request == 0  # the cut falls inside the long request


def _select_with(model, tokens, computed):
    with use_cost_model(model):
        return _select(tokens, computed)
