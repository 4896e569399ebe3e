"""Workload generation: determinism, totals, scaling, shapes, orders, token ids."""

import json

import numpy as np
import pytest

from pytest_afd.core.backend import PromptRequest
from pytest_afd.workloads import (
    ADVERSARIAL,
    BIMODAL,
    DISTRIBUTIONS,
    HEAVY_TAILED,
    LONG_SHORT,
    NARROW,
    ORDERS,
    UNIFORM,
    WorkloadSpec,
    apportion,
    build_workload,
    make_workload,
    workload_from_json,
    workload_matrix,
)

SMALL = {"target_total_tokens": 65536, "scale": 1 / 64}


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_same_spec_builds_identical_workload(distribution):
    spec = WorkloadSpec(distribution=distribution, seed=7, order="shuffled", **SMALL)
    first, second = build_workload(spec), build_workload(spec)
    assert first.prompt_lengths == second.prompt_lengths
    assert first.content_hash == second.content_hash
    assert first.prompts() == second.prompts()


@pytest.mark.parametrize("distribution", [NARROW, HEAVY_TAILED, "trace_conv", "trace_code"])
def test_seed_changes_random_distributions(distribution):
    a = make_workload(distribution, seed=1, **SMALL)
    b = make_workload(distribution, seed=2, **SMALL)
    assert a.prompt_lengths != b.prompt_lengths
    assert a.content_hash != b.content_hash


def test_seed_changes_tokens_even_when_lengths_are_fixed():
    a = make_workload(UNIFORM, seed=1, **SMALL)
    b = make_workload(UNIFORM, seed=2, **SMALL)
    assert a.prompt_lengths == b.prompt_lengths
    assert a.content_hash != b.content_hash


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_every_distribution_has_the_same_scaled_total(distribution, order):
    workload = make_workload(distribution, order=order, seed=3, **SMALL)
    assert workload.total_tokens == 65536 // 64
    assert min(workload.prompt_lengths) >= 1
    assert workload.num_requests == 8
    assert workload.stats.total == workload.total_tokens


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_shuffled_is_a_permutation_of_the_fixed_prompts(distribution):
    fixed = make_workload(distribution, order="fixed", seed=5, **SMALL)
    shuffled = make_workload(distribution, order="shuffled", seed=5, **SMALL)
    as_set = lambda w: {(p.request_id, p.prompt_token_ids) for p in w.prompts()}  # noqa: E731
    assert as_set(fixed) == as_set(shuffled)
    assert fixed.source_indices == tuple(range(8))
    assert shuffled.source_indices != fixed.source_indices


def test_tiny_scale_keeps_at_least_one_token_per_prompt():
    workload = make_workload(HEAVY_TAILED, num_requests=16, scale=1e-6)
    assert workload.prompt_lengths == (1,) * 16


def test_scale_without_target_keeps_the_shape():
    full = make_workload(BIMODAL)
    small = make_workload(BIMODAL, scale=1 / 16)
    assert small.total_tokens == round(full.total_tokens / 16)
    assert np.allclose(np.array(small.prompt_lengths) * 16, full.prompt_lengths, rtol=0.05)


def test_shapes():
    uniform = make_workload(UNIFORM, **SMALL)
    assert uniform.stats.cv == 0.0

    bimodal = make_workload(BIMODAL, **SMALL)
    assert len(set(bimodal.prompt_lengths)) == 2
    long_positions = [i for i, n in enumerate(bimodal.prompt_lengths) if n == bimodal.stats.max]
    assert long_positions == [2, 6]  # spread, not clustered

    adversarial = make_workload(ADVERSARIAL, **SMALL)
    assert sorted(adversarial.prompt_lengths) == sorted(bimodal.prompt_lengths)
    assert list(adversarial.prompt_lengths) == sorted(adversarial.prompt_lengths, reverse=True)

    long_short = make_workload(LONG_SHORT, **SMALL)
    lengths = long_short.prompt_lengths
    assert lengths[0] > sum(lengths[1:])
    assert max(lengths[1:]) - min(lengths[1:]) <= 1


def test_narrow_and_heavy_tailed_dispersion():
    narrow = make_workload(NARROW, num_requests=4000, seed=11)
    heavy = make_workload(HEAVY_TAILED, num_requests=4000, seed=11)
    assert narrow.stats.cv == pytest.approx(0.1, abs=0.01)
    assert heavy.stats.cv > 1.0
    assert heavy.stats.max / heavy.stats.p50 > 20


def test_token_ids_are_prompt_requests_within_the_vocabulary():
    workload = make_workload(BIMODAL, vocab_size=97, **SMALL)
    prompts = workload.prompts()
    assert all(isinstance(p, PromptRequest) for p in prompts)
    assert [p.num_prompt_tokens for p in prompts] == list(workload.prompt_lengths)
    ids = np.concatenate([np.array(p.prompt_token_ids) for p in prompts])
    assert ids.min() >= 0 and ids.max() < 97
    assert len({p.request_id for p in prompts}) == len(prompts)
    assert len({p.prompt_token_ids[:8] for p in prompts}) == len(prompts)


def test_vocab_size_changes_identity():
    assert (
        make_workload(UNIFORM, vocab_size=100, **SMALL).content_hash
        != make_workload(UNIFORM, vocab_size=101, **SMALL).content_hash
    )


def test_describe_is_json_and_round_trips():
    workload = make_workload("trace_code", order="shuffled", seed=4, **SMALL)
    described = json.loads(json.dumps(workload.describe()))
    assert described["content_hash"] == workload.content_hash
    assert described["stats"]["total"] == 1024
    assert described["source"]["trace"] == "code"
    rebuilt = workload_from_json(json.dumps(workload.spec.to_dict()))
    assert rebuilt.content_hash == workload.content_hash


def test_apportion_is_exact_and_proportional():
    result = apportion([1.0, 2.0, 3.0, 4.0], 100)
    assert result.tolist() == [10, 20, 30, 40]
    result = apportion([1.0, 1.0, 1.0], 10)
    assert result.sum() == 10 and result.max() - result.min() == 1
    result = apportion([1e-9, 1.0, 1000.0], 5)
    assert result.sum() == 5 and result.min() == 1
    with pytest.raises(ValueError, match="total=2"):
        apportion([1.0, 1.0, 1.0], 2)
    with pytest.raises(ValueError, match="weights"):
        apportion([1.0, 0.0], 10)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"distribution": "zipf"}, "distribution='zipf'"),
        ({"distribution": UNIFORM, "order": "random"}, "order='random'"),
        ({"distribution": UNIFORM, "seed": -1}, "seed=-1"),
        ({"distribution": UNIFORM, "num_requests": 0}, "num_requests=0"),
        ({"distribution": UNIFORM, "scale": 0}, "scale=0"),
        ({"distribution": UNIFORM, "target_total_tokens": 3}, "target_total_tokens=3"),
        ({"distribution": UNIFORM, "vocab_size": 1}, "vocab_size=1"),
        ({"distribution": UNIFORM, "requested_hit_ratio": 1.0}, "requested_hit_ratio=1.0"),
        ({"distribution": UNIFORM, "requested_hit_ratio": -0.1}, "requested_hit_ratio=-0.1"),
        ({"distribution": UNIFORM, "block_size": 0}, "block_size=0"),
        ({"distribution": UNIFORM, "arrival": "burst"}, "arrival='burst'"),
        ({"distribution": UNIFORM, "arrival": "poisson"}, "arrival_rate=None"),
        ({"distribution": UNIFORM, "arrival_rate": 2.0}, "arrival_rate=2.0"),
        ({"distribution": UNIFORM, "arrival_trace": "chat"}, "arrival_trace='chat'"),
        ({"distribution": UNIFORM, "trace_sampling": "all"}, "trace_sampling='all'"),
    ],
)
def test_bad_spec_names_the_bad_value(fields, named):
    with pytest.raises(ValueError) as info:
        WorkloadSpec(**fields)
    assert named in str(info.value)


def test_stage_c_matrix_shares_the_total_and_pairs_orders():
    matrix = workload_matrix(seed=3, **SMALL)
    assert [(w.spec.distribution, w.spec.order) for w in matrix] == [
        (d, o) for d in DISTRIBUTIONS for o in ORDERS
    ]
    assert {w.total_tokens for w in matrix} == {1024}
    assert len({w.content_hash for w in matrix}) == len(matrix)
