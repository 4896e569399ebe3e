"""Prefix-cache workloads: a whole-block shared prefix sized for the requested hit ratio."""

import numpy as np
import pytest

from pytest_afd.workloads import STAGE_B_HIT_RATIOS, make_workload, prefix_cache_workloads

BLOCK = 16
SMALL = {"target_total_tokens": 65536, "scale": 1 / 64, "block_size": BLOCK}


def _cached_whole_blocks(cached_prompt, prompt, block_size):
    """Tokens of ``prompt`` a full-block prefix cache holding ``cached_prompt`` would serve."""
    matched = 0
    while matched + block_size <= min(len(prompt), len(cached_prompt)) - 1 and (
        prompt[matched : matched + block_size] == cached_prompt[matched : matched + block_size]
    ):
        matched += block_size
    return matched


def test_stage_b_sweep_keeps_total_and_hits_the_requested_ratio():
    workloads = prefix_cache_workloads(**SMALL)
    assert [w.spec.requested_hit_ratio for w in workloads] == list(STAGE_B_HIT_RATIOS)
    for workload in workloads:
        assert workload.total_tokens == 1024
        assert workload.shared_prefix_tokens % BLOCK == 0
        # Within half a block per request of the request.
        tolerance = BLOCK / 2 * workload.num_requests / workload.total_tokens
        assert workload.designed_hit_ratio == pytest.approx(
            workload.spec.requested_hit_ratio, abs=tolerance
        )
    assert len({w.content_hash for w in workloads}) == len(workloads)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.9])
@pytest.mark.parametrize("distribution", ["uniform", "bimodal", "trace_conv"])
def test_warm_cache_serves_exactly_the_shared_prefix(distribution, ratio):
    workload = make_workload(distribution, requested_hit_ratio=ratio, seed=9, **SMALL)
    (warmup,) = workload.prefix_warmup_prompts()
    prompts = workload.prompts()
    cached = workload.cached_prefix_tokens
    assert max(cached) == workload.shared_prefix_tokens
    assert all(p.prompt_token_ids[:c] == warmup.prompt_token_ids[:c]
               for p, c in zip(prompts, cached, strict=True))
    served = [
        _cached_whole_blocks(warmup.prompt_token_ids, p.prompt_token_ids, BLOCK) for p in prompts
    ]
    assert served == list(cached)
    assert sum(served) / workload.total_tokens == pytest.approx(workload.designed_hit_ratio)
    # Unique suffixes never hit each other beyond the prefix.
    suffix_blocks = {p.prompt_token_ids[c : c + BLOCK] for p, c in zip(prompts, cached,
                                                                         strict=True)}
    assert len(suffix_blocks) == len(prompts)


def test_zero_ratio_has_no_prefix_and_no_warmup():
    workload = make_workload("uniform", **SMALL)
    assert workload.shared_prefix_tokens == 0
    assert workload.prefix_warmup_prompts() == []
    firsts = {p.prompt_token_ids[:BLOCK] for p in workload.prompts()}
    assert len(firsts) == workload.num_requests


def test_prefix_keeps_the_prompt_lengths():
    plain = make_workload("bimodal", **SMALL)
    cached = make_workload("bimodal", requested_hit_ratio=0.5, **SMALL)
    assert cached.prompt_lengths == plain.prompt_lengths  # tests/workloads/test_hit_ratio_twins
    assert np.min(cached.uncached_lengths) >= 1


def test_prefix_below_one_block_is_rejected_with_the_numbers():
    with pytest.raises(ValueError, match="block_size=128"):
        make_workload("uniform", requested_hit_ratio=0.25, target_total_tokens=1024, block_size=128)


def test_prefix_leaving_no_unique_token_is_rejected():
    with pytest.raises(ValueError, match="no prompt is longer than one block"):
        make_workload(
            "uniform",
            num_requests=4,
            requested_hit_ratio=0.9,
            target_total_tokens=64,
            block_size=16,
        )


@pytest.mark.parametrize("ratio", STAGE_B_HIT_RATIOS)
def test_scheduler_prefix_index_realizes_the_designed_ratio(ratio):
    """Cross-check with the project's full-block PrefixCacheIndex: cold 0, steady = designed."""
    from pytest_afd.scheduling import PrefixCacheIndex

    workload = make_workload("heavy_tailed", requested_hit_ratio=ratio, seed=2, **SMALL)
    index = PrefixCacheIndex(BLOCK)
    prompts = workload.prompts()
    assert all(index.lookup(p.prompt_token_ids) == 0 for p in prompts)  # cold phase
    for warmup in workload.prefix_warmup_prompts():
        index.insert(warmup.prompt_token_ids)
    hits = [index.lookup(p.prompt_token_ids) for p in prompts]
    assert hits == list(workload.cached_prefix_tokens)
    assert sum(hits) / workload.total_tokens == pytest.approx(workload.designed_hit_ratio)
