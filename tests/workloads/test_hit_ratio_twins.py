"""Hit-ratio twins: the same logical prompts (lengths and totals equal), only the shared
prefix varies, so a hit-ratio comparison measures cache hits, not prompt shape."""

import pytest

from pytest_afd.workloads import make_workload

# Stage D's follow-up workloads at a small scale (the issue: long_short p50 26 -> 103,
# max 840 -> 306 between hit 0 and hit 75 before).
FIELDS = {"num_requests": 16, "target_total_tokens": 65536, "scale": 1 / 16, "block_size": 16,
          "vocab_size": 128, "seed": 3}


@pytest.mark.parametrize("distribution", ["uniform", "long_short", "bimodal", "heavy_tailed"])
@pytest.mark.parametrize("ratio", [0.25, 0.75])
def test_twins_share_every_prompt_length_and_the_total(distribution, ratio):
    cold = make_workload(distribution, **FIELDS)
    warm = make_workload(distribution, requested_hit_ratio=ratio, **FIELDS)
    assert warm.prompt_lengths == cold.prompt_lengths
    assert warm.total_tokens == cold.total_tokens and warm.stats == cold.stats
    assert warm.shared_prefix_tokens > 0
    cold_ids, warm_ids = cold.token_ids(), warm.token_ids()
    prefix = warm_ids[warm.cached_prefix_tokens.index(warm.shared_prefix_tokens)]
    for ids, cached, length in zip(warm_ids, warm.cached_prefix_tokens, warm.prompt_lengths,
                                   strict=True):
        assert ids.size == length and 0 < cached < length and cached % FIELDS["block_size"] == 0
        assert (ids[:cached] == prefix[:cached]).all()  # the shared prefix's first tokens
    # Only the shared part differs: each prompt's unique tail is the cold twin's.
    for cold_prompt, warm_prompt, cached in zip(cold_ids, warm_ids, warm.cached_prefix_tokens,
                                                strict=True):
        assert (warm_prompt[cached:] == cold_prompt[: cold_prompt.size - cached]).all()
    described = warm.describe()
    assert described["cached_prefix_tokens"] == list(warm.cached_prefix_tokens)
    assert described["uncached_stats"]["mean"] < described["stats"]["mean"]


def test_the_design_gets_as_close_to_the_requested_ratio_as_the_lengths_allow():
    uniform = make_workload("uniform", requested_hit_ratio=0.75, **FIELDS)
    assert uniform.designed_hit_ratio == pytest.approx(0.75, abs=0.03)
    # long_short: 15 short prompts cap what they can share; the long one carries the rest.
    long_short = make_workload("long_short", requested_hit_ratio=0.75, **FIELDS)
    assert abs(long_short.designed_hit_ratio - 0.75) <= 0.1
    assert max(long_short.cached_prefix_tokens) > min(long_short.cached_prefix_tokens)


def test_a_ratio_no_prompt_can_hold_names_the_block_size():
    with pytest.raises(ValueError, match="block_size=4096"):
        make_workload("uniform", requested_hit_ratio=0.5, **{**FIELDS, "block_size": 4096})
