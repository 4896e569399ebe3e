"""The cost model and the ``cost_balanced`` cut against a plain-Python reference (issue 40,
finding 8: mutants of ``afd_split/plan/cost.py`` that no test would catch).

The reference recomputes each query row's attended keys by a loop over requests, each
ubatch's attention and FFN time from the model's formula, and the two-stage makespan by
stepping through the schedule event by event; the cut is the exhaustive argmin (ties to the
larger cut) unless it gains less than ``MIN_MODELLED_GAIN`` over the token-balanced cut.
The cases are random, with heavy per-key costs and few tokens, where one key more or less,
or a cut one step off, changes the answer.
"""

from __future__ import annotations

import numpy as np
import pytest

from afd_split import SplitConstraints
from afd_split.plan.cost import (
    MIN_MODELLED_GAIN,
    CostModel,
    StageSample,
    attended_keys_per_row,
    fit_cost_model,
    modelled_plan_cost,
    select_cost_balanced_cut,
    use_cost_model,
)
from afd_split.plan.policies.token_balanced import select_token_balanced_cut


def reference_keys(tokens, computed, key_cap):
    keys = []
    for count, done in zip(tokens, computed, strict=True):
        for offset in range(count):
            value = done + offset + 1
            keys.append(value if key_cap is None else min(value, key_cap))
    return keys


def reference_makespan(attention, ffn, layers):
    attention_free = ffn_free = 0.0
    expert_done = [0.0] * len(attention)
    for _ in range(layers):
        for u in range(len(attention)):
            attention_free = max(attention_free, expert_done[u]) + attention[u]
            ffn_free = max(ffn_free, attention_free) + ffn[u]
            expert_done[u] = ffn_free
    return max([attention_free, *expert_done])


def reference_stage_costs(model, keys, cut, total_rows):
    head_keys, tail_keys = float(sum(keys[:cut])), float(sum(keys[cut:]))
    head_rows, tail_rows = float(cut), float(total_rows) - float(cut)

    def attention(rows, attended):
        return (model.attention_fixed_s + model.attention_per_token_s * rows
                + model.attention_per_key_s * attended)

    def ffn(rows):
        return model.expert_fixed_s + (model.expert_per_token_s + model.transfer_per_token_s) * rows

    return [attention(head_rows, head_keys), attention(tail_rows, tail_keys)], [
        ffn(head_rows), ffn(tail_rows)]


def reference_cut(model, tokens, computed, constraints):
    num_tokens = sum(tokens)
    keys = reference_keys(tokens, computed, model.key_cap)
    total_rows = constraints.total_rows_for(num_tokens)
    low = max(constraints.min_ubatch_tokens, 1)
    high = num_tokens - max(constraints.min_ubatch_tokens, 1)
    cuts = [c for c in range(low, high + 1) if c % constraints.align == 0]
    cost = {c: reference_makespan(*reference_stage_costs(model, keys, c, total_rows),
                                  model.num_moe_layers) for c in cuts}
    best_value = min(cost.values())
    best = max(c for c in cuts if cost[c] == best_value)
    counts = np.asarray(tokens)
    balanced = select_token_balanced_cut(counts, counts.cumsum(), constraints, None)
    if cost[best] > cost[balanced] * (1.0 - MIN_MODELLED_GAIN):
        return balanced
    return best


def random_case(rng):
    num = int(rng.integers(1, 5))
    tokens = [int(t) for t in rng.integers(1, 12, num)]
    computed = [int(c) for c in rng.integers(0, 30, num) * (rng.random(num) < 0.6)]
    model = CostModel(
        attention_per_token_s=float(rng.choice([0.0, 1e-3, 1.0])),
        attention_per_key_s=float(rng.choice([0.0, 0.5, 1.0, 3.0])),
        expert_per_token_s=float(rng.choice([0.5, 1.0, 4.0, 20.0])),
        attention_fixed_s=float(rng.choice([0.0, 2.0])),
        expert_fixed_s=float(rng.choice([0.0, 1.0])),
        transfer_per_token_s=float(rng.choice([0.0, 0.25])),
        num_moe_layers=int(rng.integers(1, 4)),
        key_cap=None if rng.random() < 0.7 else int(rng.integers(1, 10)),
    )
    align = int(rng.choice([1, 1, 2]))
    total = sum(tokens)
    padded = None if rng.random() < 0.6 else total + int(rng.integers(0, 6))
    padded = None if padded is None else -(-padded // align) * align
    constraints = SplitConstraints(align=align, padded_total=padded,
                                   min_ubatch_tokens=int(rng.choice([1, 1, 2])))
    return model, tokens, computed, constraints


def feasible(tokens, constraints):
    low = max(constraints.min_ubatch_tokens, 1)
    high = sum(tokens) - low
    return any(c % constraints.align == 0 for c in range(low, high + 1))


def test_the_cost_balanced_cut_is_the_reference_s_on_random_small_batches():
    """Kills mutants of ``select_cost_balanced_cut``, ``ubatch_stage_costs``,
    ``two_stage_makespan`` and ``attended_keys_per_row`` that move a cut or a cost, e.g.
    ``x_select_cost_balanced_cut__mutmut_25`` (the key prefix sums starting at 1, not 0)."""
    rng = np.random.default_rng(40)
    checked = moved = 0
    while checked < 400:
        model, tokens, computed, constraints = random_case(rng)
        if not feasible(tokens, constraints):
            continue
        counts = np.asarray(tokens)
        with use_cost_model(model):
            cut = select_cost_balanced_cut(counts, counts.cumsum(), constraints,
                                           np.asarray(computed))
        assert cut == reference_cut(model, tokens, computed, constraints), (
            model, tokens, computed, constraints)
        balanced = select_token_balanced_cut(counts, counts.cumsum(), constraints, None)
        moved += cut != balanced
        checked += 1
    assert moved >= 40, moved  # the cases exercise the cost model, not only the fallback


def test_modelled_plan_cost_is_the_reference_s_split_and_unsplit():
    """Every figure ``modelled_plan_cost`` records as evidence, with and without padding."""
    rng = np.random.default_rng(41)
    for _ in range(200):
        model, tokens, computed, _ = random_case(rng)
        num_tokens = sum(tokens)
        keys = reference_keys(tokens, computed, model.key_cap)
        padding = int(rng.integers(0, 4))
        rows = num_tokens + padding
        got = modelled_plan_cost(model, np.asarray(tokens), np.asarray(computed), None, rows)
        attention, ffn = reference_stage_costs(model, keys, num_tokens, num_tokens)
        attention = [attention[0] + model.attention_per_token_s * padding]
        ffn = [ffn[0] + (model.expert_per_token_s + model.transfer_per_token_s) * padding]
        assert got == {"cut": None, "attention_s": attention, "ffn_s": ffn,
                       "makespan_s": reference_makespan(attention, ffn, model.num_moe_layers)}
        if num_tokens < 2:
            continue
        cut = int(rng.integers(1, num_tokens))
        got = modelled_plan_cost(model, np.asarray(tokens), np.asarray(computed), cut, rows)
        attention, ffn = reference_stage_costs(model, keys, cut, rows)
        assert got == {"cut": cut, "attention_s": attention, "ffn_s": ffn,
                       "makespan_s": reference_makespan(attention, ffn, model.num_moe_layers)}


def test_attended_keys_of_unsigned_counts_are_int64_and_a_bad_shape_is_named():
    """uint64 counts are cast to int64 first (numpy turns uint64 - int64 into float64).
    Kills ``x_attended_keys_per_row__mutmut_5`` (the cast dropped) and ``_17`` (the
    message's last words)."""
    tokens = np.array([3, 2], dtype=np.uint64)
    keys = attended_keys_per_row(tokens, np.array([0, 4], dtype=np.uint64), None)
    assert keys.dtype == np.int64 and keys.tolist() == [1, 2, 3, 5, 6]
    with pytest.raises(ValueError, match=r"^num_computed_tokens has shape \(1,\), expected "
                                         r"\(2,\) \(one count per request\)$"):
        attended_keys_per_row(np.array([3, 2]), np.array([0]), None)


def test_a_key_cap_of_one_is_accepted_and_zero_refused():
    """Kills ``CostModel.__post_init__`` ``key_cap < 1`` -> ``<= 1`` (mutant 25)."""
    assert CostModel(1e-6, 1e-9, 1e-6, key_cap=1).key_cap == 1
    with pytest.raises(ValueError, match=r"^CostModel.key_cap must be None or >= 1, got 0$"):
        CostModel(1e-6, 1e-9, 1e-6, key_cap=0)


def test_a_negative_fitted_coefficient_is_dropped_and_the_others_refitted():
    """Attention time that falls with the key count: plain least squares gives the key
    coefficient < 0; the fit drops it and refits the fixed and per-row terms exactly.
    Kills ``x__nonnegative_least_squares__mutmut_26`` (``solution < 0`` -> ``< 1``, which
    drops every coefficient below one second)."""
    rows = [10, 20, 40, 80, 160]
    keys = [500, 300, 200, 100, 50]
    samples = [StageSample(n, k, 1e-3 + 2e-6 * n - 1e-7 * k, 5e-4 + 3e-6 * n, 1e-8 * n)
               for n, k in zip(rows, keys, strict=True)]
    fitted = fit_cost_model(samples, num_moe_layers=2)
    assert fitted.attention_per_key_s == 0.0
    design = np.stack([np.ones(5), np.array(rows, dtype=float)], axis=1)
    refit, *_ = np.linalg.lstsq(design, np.array([s.attention_s for s in samples]), rcond=None)
    assert refit.min() > 0
    assert fitted.attention_fixed_s == pytest.approx(refit[0], rel=1e-9)
    assert fitted.attention_per_token_s == pytest.approx(refit[1], rel=1e-9)
    assert fitted.expert_fixed_s == pytest.approx(5e-4, rel=1e-9)
    assert fitted.expert_per_token_s == pytest.approx(3e-6, rel=1e-9)
    assert fitted.transfer_per_token_s == pytest.approx(1e-8, rel=1e-9)
