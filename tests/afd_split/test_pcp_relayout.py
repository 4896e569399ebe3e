"""Rows between the parent's whole-request zigzag and each stage's own zigzag, on every rank.

The expected rows come from ``pcp_helper_reference.helper_layout`` (plain
per-request Python): the parent's layout of the whole batch, and each stage's
layout of its pieces (a cut request's head and tail each laid out alone).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from afd_split import SplitConstraints, plan_split
from afd_split.pcp.relayout import (
    NO_SOURCE,
    all_rank_relayouts,
    rank_relayout,
    relay_all_ranks,
    relay_rows,
    restore_all_ranks,
    restore_rows,
)
from afd_split.pcp.stage import stage_tokens
from tests.adapters.pcp_runner_model import rank_positions
from tests.afd_split.pcp_helper_reference import helper_layout
from tests.afd_split.thread_group import ThreadGroup


def _plan(counts, computed, pcp, align=1):
    return plan_split(list(counts), policy="token_balanced",
                      constraints=SplitConstraints(pcp_size=pcp, align=align),
                      num_computed_tokens=list(computed), allow_fallback=True)


def _marked(sources):
    """Token t as the value t + 1; padding as 0 (what restored padding rows hold)."""
    return np.array([s + 1 if s >= 0 else 0 for s in sources], dtype=np.int64)[:, None]


def _expected_stage_rows(plan, computed, rank):
    rows = []
    for stage in stage_tokens(plan, computed):
        sources = helper_layout(stage.num_scheduled_tokens.tolist(),
                                plan.constraints.pcp_size)["sources"][rank]
        rows.extend(s + stage.token_start if s >= 0 else -1 for s in sources)
    return _marked(rows)


def _expected_positions(plan, computed, rank):
    return np.concatenate([
        rank_positions(stage.num_scheduled_tokens.tolist(), stage.num_computed_tokens.tolist(),
                       plan.constraints.pcp_size, rank)[1]
        for stage in stage_tokens(plan, computed)])


def _random_cases(seed, count):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        pcp = int(rng.choice([2, 4, 8]))
        num = int(rng.integers(1, 6))
        counts = rng.integers(1, 70, size=num)
        if rng.random() < 0.3:  # leading decodes
            counts[: int(rng.integers(0, num + 1))] = 1
        computed = rng.integers(0, 60, size=num)
        plan = _plan(counts, computed, pcp, align=int(rng.choice([1, 2, 2 * pcp])))
        if plan.is_split:
            yield plan, computed


def test_every_rank_gets_each_stages_own_zigzag_and_back():
    cut = 0
    for plan, computed in _random_cases(seed=3, count=400):
        pcp = plan.constraints.pcp_size
        parent = helper_layout(plan.token_counts.tolist(), pcp)["sources"]
        relayouts = [rank_relayout(plan, computed, rank) for rank in range(pcp)]
        per_rank = [_marked(parent[rank]) for rank in range(pcp)]
        staged = relay_all_ranks(relayouts, per_rank)
        for rank in range(pcp):
            assert np.array_equal(staged[rank], _expected_stage_rows(plan, computed, rank))
            assert np.array_equal(relayouts[rank].stage_positions,
                                  _expected_positions(plan, computed, rank))
        back = restore_all_ranks(relayouts, staged)
        for rank in range(pcp):
            assert np.array_equal(back[rank], per_rank[rank])
        cut += plan.boundary_request is not None
    assert cut > 100  # the interesting case: a request cut in two


def test_one_token_pieces_become_decodes_and_are_exchanged_with_their_neighbour():
    """[1, 2, 1] cut at 2: both stages are all one-token pieces, i.e. decodes (a copy on every
    rank); request 2 was a prefill in the parent (not leading), so it moves too."""
    plan = _plan([1, 2, 1], [0, 0, 0], 2)
    assert [u.num_real_tokens for u in plan.ubatches] == [2, 2]
    parent = helper_layout([1, 2, 1], 2)["sources"]
    relayouts = [rank_relayout(plan, [0, 0, 0], rank) for rank in range(2)]
    assert relayouts[0].exchanged_requests.tolist() == [1, 2]
    staged = relay_all_ranks(relayouts, [_marked(parent[rank]) for rank in range(2)])
    for rank in range(2):
        assert staged[rank][:, 0].tolist() == [1, 2, 3, 4]  # every token on every rank


def test_whole_request_stages_move_nothing():
    plan = plan_split([40, 64, 30, 50], policy="request_boundary",
                      constraints=SplitConstraints(pcp_size=4), num_computed_tokens=[0, 8, 0, 4])
    for rank in range(4):
        relayout = rank_relayout(plan, [0, 8, 0, 4], rank)
        assert len(relayout.inbound.send_rows) == len(relayout.outbound.send_rows) == 0
        assert relayout.inbound.received_rows == relayout.outbound.received_rows == 0
        assert relayout.exchanged_requests.tolist() == []
        assert np.array_equal(relayout.stage_sources, np.arange(relayout.parent_rows))


def test_only_the_cut_request_is_exchanged():
    plan = _plan([300, 700, 200], [0, 128, 0], 8, align=16)
    assert plan.boundary_request == 1
    relayout = rank_relayout(plan, [0, 128, 0], 0)  # rank 0 holds the last chunk: padding
    assert relayout.exchanged_requests.tolist() == [1]
    # each rank receives only the rows of request 1's pieces it lacks (at most its 40 + 50
    # rows of them), not the 8 x 88 rows of the whole request an all-gather would bring
    received = [rank_relayout(plan, [0, 128, 0], rank).inbound.received_rows
                for rank in range(8)]
    assert 0 < max(received) <= 40 + 50
    sent = [sum(rank_relayout(plan, [0, 128, 0], rank).inbound.send_counts) for rank in range(8)]
    assert sum(sent) == sum(received)
    assert NO_SOURCE in relayout.stage_sources  # the pieces' own padding rows


def test_relay_and_restore_with_each_rank_passing_only_its_own_rows():
    plan = _plan([96, 40, 120, 1, 64], [0, 32, 200, 9, 16], 4, align=8)
    computed = [0, 32, 200, 9, 16]
    assert plan.boundary_request is not None
    group = ThreadGroup(4)
    parent = helper_layout(plan.token_counts.tolist(), 4)["sources"]

    def rank_main(rank):
        relayout = rank_relayout(plan, computed, rank)
        rows = torch.from_numpy(_marked(parent[rank])).float().repeat(1, 3)
        staged = relay_rows(relayout, rows, group.all_to_all_for(rank))
        back = restore_rows(relayout, staged * 2, group.all_to_all_for(rank))
        return staged, back, rows

    results = group.run(rank_main)
    for rank, (staged, back, rows) in enumerate(results):
        expected = torch.from_numpy(_expected_stage_rows(plan, computed, rank)).float()
        assert torch.equal(staged, expected.repeat(1, 3))
        assert torch.equal(back, rows * 2)


def test_bad_inputs_name_the_rank_and_rows():
    plan = _plan([96, 40], [0, 8], 2)
    with pytest.raises(ValueError, match="pcp_rank=2 is outside the 2 PCP ranks"):
        rank_relayout(plan, [0, 8], 2)
    relayout = rank_relayout(plan, [0, 8], 0)
    with pytest.raises(ValueError, match="5 parent rows on PCP rank 0"):
        relay_rows(relayout, np.zeros((5, 1)), lambda rows, send, recv: rows)
    with pytest.raises(ValueError, match="3 stage rows on PCP rank 0"):
        restore_rows(relayout, np.zeros((3, 1)), lambda rows, send, recv: rows)
    parent = np.zeros((relayout.parent_rows, 1))
    with pytest.raises(ValueError, match="the all-to-all returned 0 rows"):
        relay_rows(relayout, parent, lambda rows, send, recv: rows[:0])


def test_all_ranks_at_once_equal_each_rank_alone():
    for plan, computed in _random_cases(seed=11, count=40):
        for together, rank in zip(all_rank_relayouts(plan, computed),
                                  range(plan.constraints.pcp_size), strict=True):
            alone = rank_relayout(plan, computed, rank)
            for name in ("stage_sources", "parent_sources", "stage_positions"):
                assert np.array_equal(getattr(together, name), getattr(alone, name))
            assert together.inbound.send_counts == alone.inbound.send_counts
            assert together.outbound.recv_counts == alone.outbound.recv_counts
