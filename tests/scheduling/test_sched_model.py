"""Hand-computed cases for every rule of chunk-semantics.md, written from the rules."""

import pytest

from pytest_afd.scheduling import SchedulerConfig, forward_rows_per_rank, schedule


def tokens_per_batch(plan):
    return [batch.num_tokens for batch in plan.batches]


# --- §2 page-granular admission -------------------------------------------------


def test_16388_one_slot_is_8192_8192_4_with_a_tail_batch():
    plan = schedule([16388], config=SchedulerConfig(chunk_size=8192, max_prefill_reqs=1))
    assert plan.valid and plan.reasons == ()
    assert tokens_per_batch(plan) == [8192, 8192, 4]
    assert plan.chunks_of(0) == (8192, 8192, 4)
    assert [b.num_computed_tokens for b in plan.batches] == [(0,), (8192,), (16384,)]
    assert [b.chunks[0].is_final for b in plan.batches] == [False, False, True]
    # The 4-token tail is charged one whole page.
    assert [b.charged_tokens for b in plan.batches] == [8192, 8192, 128]
    assert plan.tail_batch_indices == (2,)
    assert plan.forwards_per_request == (3,)
    assert plan.total_scheduled_tokens == 16388


def test_two_16388_prompts_one_slot_pay_two_tail_forwards():
    plan = schedule([16388, 16388], config=SchedulerConfig(chunk_size=8192, max_prefill_reqs=1))
    assert tokens_per_batch(plan) == [8192, 8192, 4, 8192, 8192, 4]
    assert plan.tail_batch_indices == (2, 5)


def test_two_slots_let_the_tail_share_a_batch_charged_one_page():
    plan = schedule([16388, 16388], config=SchedulerConfig(chunk_size=8192, max_prefill_reqs=2))
    # Batch 3: tail 4 (charged 128) + 8192 - 128 = 8064 of request 1, which becomes chunked.
    # Request 1 then has 16388 - 8064 = 8324 left: 8192, then 132 (charged 256).
    assert [b.num_scheduled_tokens for b in plan.batches] == [
        (8192,),
        (8192,),
        (4, 8064),
        (8192,),
        (132,),
    ]
    assert [b.request_indices for b in plan.batches][2] == (0, 1)
    assert [b.charged_tokens for b in plan.batches] == [8192, 8192, 8192, 8192, 256]
    # 132 tokens is more than one page: not a tail batch by the definition.
    assert plan.tail_batch_indices == ()
    assert plan.num_batches == 5
    assert plan.forwards_per_request == (3, 3)
    assert plan.total_scheduled_tokens == 2 * 16388


def test_budget_is_charged_in_whole_pages_not_tokens():
    # 100-token prompts cost 128 each: 1024 // 128 = 8 fit, though 10 * 100 <= 1024.
    plan = schedule([100] * 10, config=SchedulerConfig(chunk_size=1024, max_prefill_reqs=16))
    assert [b.num_requests for b in plan.batches] == [8, 2]
    assert [b.charged_tokens for b in plan.batches] == [1024, 256]
    assert tokens_per_batch(plan) == [800, 200]


def test_a_request_whose_page_rounded_length_fills_the_budget_closes_the_batch():
    # 1000 tokens charge 1024: nothing of the next request fits this batch.
    plan = schedule([1000, 1000], config=SchedulerConfig(chunk_size=1024))
    assert [b.num_scheduled_tokens for b in plan.batches] == [(1000,), (1000,)]
    assert plan.forwards_per_request == (1, 1)


def test_truncation_takes_the_page_aligned_remainder_of_the_budget():
    # 300 charges 384; 1024 - 384 = 640 (5 pages) of the 1000-token request fit.
    plan = schedule([300, 1000], config=SchedulerConfig(chunk_size=1024))
    assert [b.num_scheduled_tokens for b in plan.batches] == [(300, 640), (360,)]
    assert [b.charged_tokens for b in plan.batches] == [1024, 384]
    assert plan.batches[1].num_computed_tokens == (640,)


def test_truncated_piece_of_a_continuing_request_is_page_aligned():
    plan = schedule([5000], config=SchedulerConfig(chunk_size=2048, page_size=256))
    assert plan.chunks_of(0) == (2048, 2048, 904)
    assert [b.charged_tokens for b in plan.batches] == [2048, 2048, 1024]


def test_request_slot_cap_limits_requests_per_batch():
    plan = schedule([10] * 5, config=SchedulerConfig(chunk_size=8192, max_prefill_reqs=2))
    assert [b.num_requests for b in plan.batches] == [2, 2, 1]


def test_max_running_seqs_caps_requests_like_pcap():
    config = SchedulerConfig(chunk_size=8192, max_prefill_reqs=8, max_running_seqs=3)
    assert config.request_slots == 3
    plan = schedule([10] * 5, config=config)
    assert [b.num_requests for b in plan.batches] == [3, 2]


def test_chunked_request_continues_first_and_takes_a_slot():
    # Batch 1: 1024 of request 0. Batch 2: its 976 tail (charged 1024) fills the budget.
    # Batch 3: requests 1 and 2 (slots 2), batch 4: request 3.
    plan = schedule([2000, 10, 10, 10], config=SchedulerConfig(chunk_size=1024, max_prefill_reqs=2))
    assert [b.request_indices for b in plan.batches] == [(0,), (0,), (1, 2), (3,)]
    assert plan.batches[1].chunks[0].num_tokens == 976


# --- §1 DP folding ----------------------------------------------------------------


def test_dp_folding_divides_the_global_chunk_and_records_both():
    plan = schedule(
        [16388], config=SchedulerConfig(chunk_size=16384, dp_size=2, max_prefill_reqs=1)
    )
    assert plan.effective_chunk == 8192
    assert plan.config.chunk_size == 16384
    assert tokens_per_batch(plan) == [8192, 8192, 4]
    as_json = plan.to_json()
    assert as_json["global_chunk"] == 16384 and as_json["effective_chunk"] == 8192


def test_dp3_folds_24576_to_8192():
    plan = schedule([8192], config=SchedulerConfig(chunk_size=24576, dp_size=3))
    assert plan.valid and plan.effective_chunk == 8192


def test_chunk_not_divisible_by_dp_is_invalid_with_reason():
    plan = schedule([8192], config=SchedulerConfig(chunk_size=65536, dp_size=3))
    assert not plan.valid
    assert plan.batches == ()
    assert any("dp 3" in reason and "65536" in reason for reason in plan.reasons)


# --- §2.3 invalid sizes -----------------------------------------------------------


def test_chunk_not_a_page_multiple_is_invalid_with_reason():
    plan = schedule([8192], config=SchedulerConfig(chunk_size=8000, page_size=128))
    assert not plan.valid
    assert any("8000" in r and "page size 128" in r for r in plan.reasons)


def test_page_multiple_after_folding_is_what_counts():
    # 384 // 3 = 128 is one page; 384 // 4 = 96 is below one page.
    assert schedule([10], config=SchedulerConfig(chunk_size=384, dp_size=3)).valid
    plan = schedule([10], config=SchedulerConfig(chunk_size=384, dp_size=4))
    assert not plan.valid
    assert any("smaller than one page" in r for r in plan.reasons)


def test_chunk_above_max_batched_tokens_is_invalid_with_reason():
    plan = schedule([10], config=SchedulerConfig(chunk_size=16384, max_batched_tokens=8192))
    assert not plan.valid
    assert any("max batched tokens 8192" in r for r in plan.reasons)


# --- unchunked ---------------------------------------------------------------------


def test_unchunked_schedules_each_request_whole_within_max_batched_tokens():
    config = SchedulerConfig(chunk_size=None, max_batched_tokens=10240)
    plan = schedule([5000, 5000, 5000], config=config)
    assert plan.effective_chunk is None
    assert [b.num_scheduled_tokens for b in plan.batches] == [(5000, 5000), (5000,)]
    assert plan.forwards_per_request == (1, 1, 1)


def test_unchunked_charges_pages_too():
    # 5000 tokens charge 5120; two do not fit 10000.
    plan = schedule([5000, 5000], config=SchedulerConfig(chunk_size=None, max_batched_tokens=10000))
    assert plan.num_batches == 2


def test_unchunked_request_longer_than_max_batched_tokens_is_invalid():
    config = SchedulerConfig(chunk_size=None, max_batched_tokens=16384)
    plan = schedule([5000, 20000], config=config)
    assert not plan.valid
    assert any("request 1" in r and "16384" in r for r in plan.reasons)


# --- §3 CP zigzag rows, §4 comm rounds -----------------------------------------


def test_without_cp_rows_are_tokens():
    plan = schedule([16388], config=SchedulerConfig(chunk_size=8192, max_prefill_reqs=1))
    assert [b.rows_per_rank for b in plan.batches] == [8192, 8192, 4]


def test_cp8_tail_of_4_tokens_still_carries_16_rows_per_rank():
    config = SchedulerConfig(chunk_size=8192, cp_size=8, max_prefill_reqs=1)
    plan = schedule([16388], config=config)
    # 8192 / 8 = 1024 (a multiple of 16); ceil(4 / 8) = 1 -> 16.
    assert [b.rows_per_rank for b in plan.batches] == [1024, 1024, 16]


def test_cp_padding_is_per_request():
    # Three 10-token requests, cp 8: each ceil(10/8) = 2 -> 16 rows; 48 in all
    # (padding the whole forward would give ceil(30/8) = 4 -> 16).
    plan = schedule([10, 10, 10], config=SchedulerConfig(chunk_size=8192, cp_size=8))
    assert plan.batches[0].rows_per_rank == 48
    assert forward_rows_per_rank([10, 10, 10], 8) == 48
    assert plan.padding_rows_per_rank == 48 - 3 * 2


def test_cp2_rows_round_to_multiples_of_four():
    # ceil(101 / 2) = 51 -> 52.
    assert forward_rows_per_rank([101], 2) == 52


def test_comm_rounds_cross_at_the_round_capacity():
    one = schedule([8192], config=SchedulerConfig(chunk_size=16384))
    two = schedule([8193], config=SchedulerConfig(chunk_size=16384))
    assert one.batches[0].comm_rounds == 1
    assert two.batches[0].comm_rounds == 2


def test_cp_padding_can_add_a_comm_round():
    # 16376 tokens, cp 2: 8188 rows -> 8188 (multiple of 4): one round.
    # 16388 tokens, cp 2: 8194 -> 8196 rows: two rounds of 8192.
    config = SchedulerConfig(chunk_size=None, cp_size=2)
    assert schedule([16376], config=config).batches[0].comm_rounds == 1
    assert schedule([16388], config=config).batches[0].rows_per_rank == 8196
    assert schedule([16388], config=config).batches[0].comm_rounds == 2


def test_round_capacity_is_configurable():
    plan = schedule([5000], config=SchedulerConfig(chunk_size=8192, round_capacity=2048))
    assert plan.batches[0].comm_rounds == 3


# --- §5 prefix hits -------------------------------------------------------------


def test_prefix_hit_schedules_only_the_uncached_suffix():
    config = SchedulerConfig(chunk_size=8192, max_prefill_reqs=1)
    plan = schedule([16388], config=config, cached_tokens=[8192])
    assert plan.chunks_of(0) == (8192, 4)
    assert [b.num_computed_tokens for b in plan.batches] == [(8192,), (16384,)]
    assert plan.total_scheduled_tokens == 16388 - 8192
    assert plan.tail_batch_indices == (1,)
    # The hit shrinks the new tokens, not the history each forward reads.
    assert [b.context_tokens for b in plan.batches] == [16384, 16388]


def test_prefix_hit_changes_batch_packing():
    # Uncached: 1000 charges 1024 -> one request per batch. With 512 cached each
    # needs 488 (charged 512): both fit one 1024 batch.
    config = SchedulerConfig(chunk_size=1024)
    assert schedule([1000, 1000], config=config).num_batches == 2
    warm = schedule([1000, 1000], config=config, cached_tokens=[512, 512])
    assert warm.num_batches == 1
    assert warm.batches[0].num_computed_tokens == (512, 512)


@pytest.mark.parametrize(
    ("prompts", "cached", "match"),
    [
        ([100], [100], "at least one token"),
        ([100], [150], "at least one token"),
        ([100], [-1], "cached_tokens"),
        ([100, 100], [0], "one per prompt"),
        ([0], None, "prompt_lengths"),
        ([-5], None, "prompt_lengths"),
    ],
)
def test_nonsense_queue_raises_naming_the_value(prompts, cached, match):
    with pytest.raises(ValueError, match=match):
        schedule(prompts, config=SchedulerConfig(chunk_size=8192), cached_tokens=cached)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"chunk_size": 0},
        {"chunk_size": -8192},
        {"chunk_size": 8192, "dp_size": 0},
        {"chunk_size": 8192, "cp_size": 0},
        {"chunk_size": 8192, "page_size": 0},
        {"chunk_size": 8192, "max_prefill_reqs": 0},
        {"chunk_size": 8192, "round_capacity": 0},
        {"chunk_size": 8192, "max_running_seqs": 0},
    ],
)
def test_nonsense_config_raises(kwargs):
    with pytest.raises(ValueError, match=next(iter(k for k in kwargs if kwargs[k] < 1))):
        SchedulerConfig(**kwargs)


def test_bool_is_not_an_integer_size():
    with pytest.raises(TypeError, match="page_size"):
        SchedulerConfig(chunk_size=8192, page_size=True)


def test_empty_queue_is_a_valid_empty_plan():
    plan = schedule([], config=SchedulerConfig(chunk_size=8192))
    assert plan.valid and plan.num_batches == 0 and plan.total_scheduled_tokens == 0


def test_to_json_has_the_planner_fields():
    plan = schedule([16388, 100], config=SchedulerConfig(chunk_size=8192, max_prefill_reqs=1))
    doc = plan.to_json()
    assert doc["num_batches"] == 4
    assert doc["chunks"] == [8192, 8192, 4]
    assert doc["forwards_per_request"] == [3, 1]
    assert doc["rows_per_rank"] == {"first": [8192, 8192, 4, 100], "max": 8192}
    assert doc["comm_rounds"]["max"] == 1 and doc["comm_rounds"]["total"] == 4
    assert doc["tail_batches"] == 1
    assert doc["valid"] is True and doc["reasons"] == []


def test_a_short_new_request_alone_is_not_a_tail_batch():
    config = SchedulerConfig(chunk_size=8192)
    assert schedule([10], config=config).tail_batch_indices == ()
    # An 8-token uncached suffix after a hit is new work, not the tail of a chunked request.
    warm = schedule([8200], config=config, cached_tokens=[8192])
    assert warm.batches[0].num_computed_tokens == (8192,)
    assert warm.tail_batch_indices == ()
