"""Full-block prefix matching: whole blocks only, chained, >= 1 token computed."""

import pytest

from pytest_afd.scheduling import (
    PrefixCacheIndex,
    SchedulerConfig,
    block_keys,
    realized_cached_tokens,
    schedule,
)

BLOCK = 4
PROMPT = list(range(1, 11))  # 10 tokens: two full blocks + 2


def test_only_full_blocks_have_keys():
    assert len(block_keys(PROMPT, BLOCK)) == 2
    assert block_keys([1, 2, 3], BLOCK) == []


def test_same_prompt_hits_whole_blocks_only():
    index = PrefixCacheIndex(BLOCK)
    index.insert(PROMPT)
    assert len(index) == 2
    assert index.lookup(PROMPT) == 8


def test_hit_is_capped_so_one_token_is_computed():
    index = PrefixCacheIndex(BLOCK)
    index.insert(PROMPT[:8])
    # The whole 8-token prompt is cached, but its last block must be recomputed.
    assert index.lookup(PROMPT[:8]) == 4
    assert index.lookup(PROMPT[:9]) == 8


def test_shared_prefix_then_divergence():
    index = PrefixCacheIndex(BLOCK)
    index.insert(PROMPT)
    assert index.lookup([*PROMPT[:8], 99, 98, 97]) == 8
    diverges_in_block_1 = [*PROMPT[:5], 99, *PROMPT[6:]]
    assert index.lookup(diverges_in_block_1) == 4


def test_keys_are_chained_so_a_matching_later_block_alone_does_not_hit():
    index = PrefixCacheIndex(BLOCK)
    index.insert(PROMPT)
    other_first_block = [99, 98, 97, 96, *PROMPT[4:]]
    assert index.lookup(other_first_block) == 0


def test_partial_block_is_never_cached():
    index = PrefixCacheIndex(BLOCK)
    index.insert([1, 2, 3])
    assert len(index) == 0
    assert index.lookup([1, 2, 3, 4, 5]) == 0


def test_cold_and_warm_phases_differ():
    shared = list(range(100, 108))  # two blocks
    prompts = [[*shared, 1, 2, 3], [*shared, 4, 5, 6], [*shared, 7]]
    index = PrefixCacheIndex(BLOCK)
    cold = index.lookup_and_insert(prompts)
    warm = index.lookup_and_insert(prompts)
    assert cold == [0, 8, 8]
    # Warm: prompt 0 and 1 hit their own two full blocks (a third would leave < 1 token);
    # prompt 2 (9 tokens) hits 8.
    assert warm == [8, 8, 8]
    index.clear()
    assert index.lookup(prompts[0]) == 0


def test_realized_hits_drive_the_schedule():
    index = PrefixCacheIndex(BLOCK)
    prompts = [list(range(20)), [*range(16), 50, 51, 52, 53, 54]]
    hits = index.lookup_and_insert(prompts)
    assert hits == [0, 16]
    plan = schedule(
        [len(p) for p in prompts],
        config=SchedulerConfig(chunk_size=16, page_size=BLOCK),
        cached_tokens=hits,
    )
    assert plan.total_scheduled_tokens == 20 + 5
    assert plan.batches[-1].num_computed_tokens[-1] == 16


@pytest.mark.parametrize(
    ("prompt", "requested", "block", "expected"),
    [
        (16388, 8192, 128, 8192),
        (16388, 8200, 128, 8192),  # a partial block does not count
        (8192, 8192, 128, 8064),  # a fully cached prompt recomputes its last block
        (1000, 1000, 128, 896),
        (1000, 0, 128, 0),
    ],
)
def test_realized_cached_tokens(prompt, requested, block, expected):
    assert realized_cached_tokens(prompt, requested, block) == expected


def test_requested_prefix_longer_than_prompt_is_rejected():
    with pytest.raises(ValueError, match="cached prefix 200 for a 100-token prompt"):
        realized_cached_tokens(100, 200, 16)


def test_bad_block_size_is_rejected():
    with pytest.raises(ValueError, match="block_size=0"):
        PrefixCacheIndex(0)
