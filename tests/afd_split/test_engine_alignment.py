"""Stage alignment from the engine's TP/SP/PCP path, checked against the runner's padding rule."""

from __future__ import annotations

import numpy as np
import pytest

from afd_split import UnsupportedSplitError, plan_split
from afd_split.pcp.alignment import EngineAlignment, stage_rank_rows


def runner_sp_padding(num_tokens: int, tp_size: int, sequence_parallel: bool) -> int:
    """vllm-ascend v0.19.1rc1 (da421afad719) ``_pad_for_sequence_parallelism``, restated: with
    SP on the step's (rank-local) token count goes up to the next multiple of tp, else stays."""
    if not sequence_parallel:
        return num_tokens
    remainder = num_tokens % tp_size
    return num_tokens if remainder == 0 else num_tokens + tp_size - remainder


def parent_rows(num_tokens: int, alignment: EngineAlignment) -> int:
    return runner_sp_padding(num_tokens, alignment.tp_size, alignment.sequence_parallel)


def test_issue_example_tp4_sp_parent_of_2020_rows():
    alignment = EngineAlignment(tp_size=4, sequence_parallel=True)
    plan = plan_split([2019], policy="token_balanced",
                      constraints=alignment.constraints(parent_rows(2019, alignment)))
    head, tail = plan.ubatches
    assert (head.num_rows, tail.num_rows) == (1008, 1012)
    # real and padded tokens apart; the parent's one padding row goes to the tail only
    assert (head.num_real_tokens, head.num_padded_tokens) == (1008, 0)
    assert (tail.num_real_tokens, tail.num_padded_tokens) == (1011, 1)
    evidence = plan.to_evidence()["ubatches"]
    assert [(u["num_real_tokens"], u["num_padded_tokens"]) for u in evidence] == [(1008, 0),
                                                                                 (1011, 1)]


CASES = [
    EngineAlignment(tp_size=1, sequence_parallel=False),
    EngineAlignment(tp_size=4, sequence_parallel=False),
    EngineAlignment(tp_size=4, sequence_parallel=True),
    EngineAlignment(tp_size=8, sequence_parallel=True),
    EngineAlignment(tp_size=1, sequence_parallel=False, pcp_size=8),
    EngineAlignment(tp_size=2, sequence_parallel=True, pcp_size=4),
    EngineAlignment(tp_size=4, sequence_parallel=True, pcp_size=8),
]


@pytest.mark.parametrize("alignment", CASES, ids=EngineAlignment.describe)
def test_every_stage_already_meets_the_runner_rule(alignment):
    rng = np.random.default_rng(alignment.tp_size * 10 + alignment.pcp_size)
    for _ in range(40):
        counts = rng.integers(1, 900, int(rng.integers(1, 6)))
        total = int(counts.sum())
        constraints = alignment.constraints(parent_rows(total, alignment))
        plan = plan_split(counts, policy="token_balanced", constraints=constraints,
                          allow_fallback=True)
        for ubatch in plan.ubatches:
            rank_rows = stage_rank_rows(ubatch.num_rows, alignment.pcp_size)
            # the runner's own rule adds nothing to a stage: its rows are already padded
            assert parent_rows(rank_rows, alignment) == rank_rows
            assert ubatch.num_rows % alignment.row_unit == 0
        if plan.is_split and not alignment.pcp_enabled:
            head, tail = plan.ubatches
            assert head.num_padded_tokens == 0  # padding only on the stage that needs it
            assert head.num_rows + tail.num_rows == parent_rows(total, alignment)


def test_unit_is_the_lcm_of_the_pcp_zigzag_and_the_rank_local_sp_unit():
    assert EngineAlignment(4, True).row_unit == 4
    assert EngineAlignment(4, False).row_unit == 1
    assert EngineAlignment(1, False, pcp_size=8).row_unit == 16
    assert EngineAlignment(4, True, pcp_size=8).row_unit == 32  # 8 ranks x 4 rows
    assert EngineAlignment(3, True, pcp_size=2).row_unit == 12  # lcm(4, 6)


def test_unaligned_parent_fails_closed_naming_the_rule():
    alignment = EngineAlignment(tp_size=4, sequence_parallel=True)
    with pytest.raises(UnsupportedSplitError) as error:
        alignment.constraints(2019)  # not what _pad_for_sequence_parallelism builds
    message = str(error.value)
    assert "num_input_tokens=2019" in message
    assert "stage alignment 4" in message
    assert "_pad_for_sequence_parallelism" in message
    with pytest.raises(UnsupportedSplitError, match="num_input_tokens=None"):
        alignment.constraints(None)


def test_stage_rank_rows_refuses_rows_that_do_not_divide():
    assert stage_rank_rows(32, 8) == 4
    assert stage_rank_rows(7, 1) == 7
    with pytest.raises(UnsupportedSplitError, match="30 rows does not divide over pcp=8"):
        stage_rank_rows(30, 8)
