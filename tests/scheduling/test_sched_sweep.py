"""Sweeps: invalid sizes omitted with reasons; round-boundary crossings reported jointly."""

from pytest_afd.scheduling import SchedulerConfig
from pytest_afd.scheduling.sweep import sweep

ONE_SLOT = SchedulerConfig(chunk_size=None, max_prefill_reqs=1)


def test_growing_the_chunk_removes_forwards_but_adds_rounds():
    # 16388 tokens, capacity 8192 rows:
    #   8192  -> 8192 + 8192 + 4: 3 forwards, 1 tail, max 1 round
    #   16384 -> 16384 + 4:       2 forwards, 1 tail, max 2 rounds
    #   32768 -> 16388:           1 forward,  0 tail, ceil(16388 / 8192) = 3 rounds
    candidates = sweep([16388], [8192, 16384, 32768], base_config=ONE_SLOT)
    assert [c.plan.num_batches for c in candidates] == [3, 2, 1]
    assert [c.plan.num_tail_batches for c in candidates] == [1, 1, 0]
    assert [c.plan.max_comm_rounds for c in candidates] == [1, 2, 3]
    assert [c.crosses_round_boundary for c in candidates] == [False, True, True]
    assert [c.is_joint for c in candidates] == [False, True, True]
    effects = candidates[2].effects()
    assert effects["compared_to"] == "16384"
    assert effects["num_batches"] == {"before": 2, "after": 1, "delta": -1}
    assert effects["tail_batches"]["delta"] == -1
    assert effects["max_comm_rounds"] == {"before": 2, "after": 3, "delta": 1}
    assert "JOINT" in candidates[2].note()


def test_same_rounds_is_not_a_crossing():
    candidates = sweep([4000, 4000], [4096, 8192], base_config=ONE_SLOT)
    assert [c.plan.max_comm_rounds for c in candidates] == [1, 1]
    assert not any(c.crosses_round_boundary for c in candidates)
    assert candidates[1].note() == ""


def test_first_candidate_over_capacity_is_flagged():
    candidates = sweep([20000], [16384], base_config=ONE_SLOT)
    assert candidates[0].crosses_round_boundary
    assert "16384 > 8192" in candidates[0].note()


def test_invalid_sizes_are_omitted_with_reasons_and_skipped_in_comparisons():
    config = SchedulerConfig(chunk_size=None, dp_size=3, max_prefill_reqs=1)
    # Only 24576 folds evenly by 3 (to 8192); 65536 does not.
    candidates = sweep([16388], [24576, 65536, None], base_config=config)
    assert [c.plan.valid for c in candidates] == [True, False, True]
    assert candidates[1].plan.reasons and candidates[1].note().startswith("omitted: ")
    assert candidates[1].effects() is None
    # unchunked is compared with 24576, the previous VALID candidate.
    assert candidates[2].previous is candidates[0].plan
    assert candidates[2].label == "unchunked"
    # 16388 rows in one forward: 3 rounds versus 1.
    assert candidates[2].crosses_round_boundary and candidates[2].is_joint


def test_sweep_json_is_serialisable():
    import json

    candidates = sweep([16388], [8192, 8000], base_config=ONE_SLOT)
    docs = json.loads(json.dumps([c.to_json() for c in candidates]))
    assert docs[0]["chunk"] == "8192" and docs[0]["plan"]["valid"] is True
    assert docs[1]["plan"]["valid"] is False and "page size 128" in docs[1]["note"]
