"""PCP stage metadata (vLLM-Ascend v0.19.1rc1): each relaid stage is the stage scheduled alone.

The expected stage is the runner model (``pcp_runner_model``, independent helper
maths) run on the stage's pieces: the head of a cut request as a fresh request,
its tail with the head's tokens counted as computed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from afd_split import SplitConstraints, SplitInvariantError, UnsupportedSplitError, plan_split
from afd_split.engine import ascend_pcp
from afd_split.engine.ascend import ASCEND_LAYOUTS
from afd_split.engine.ascend_pcp import pcp_stage_metadata
from afd_split.engine.standins import attn_state_enum
from afd_split.pcp.relayout import rank_relayout
from afd_split.pcp.stage import stage_tokens
from tests.adapters.pcp_runner_model import LAYOUT, runner_batch

BLOCK = 16
REQUEST_FIELDS = ("query_start_loc", "query_start_loc_cpu", "seq_lens", "_seq_lens_cpu",
                  "seq_lens_cpu", "num_computed_tokens_cpu", "block_table_tensor")
SCALAR_FIELDS = ("num_reqs", "num_actual_tokens", "num_input_tokens", "max_query_len",
                 "max_seq_len", "causal", "actual_seq_lengths_q", "attn_state",
                 "decode_token_per_req", "graph_pad_size", "kvcomp_metadata")


def _plan(counts, computed, pcp, align=None):
    return plan_split(list(counts), policy="token_balanced",
                      constraints=SplitConstraints(pcp_size=pcp, align=align or 2 * pcp),
                      num_computed_tokens=list(computed), allow_fallback=True)


def _stages(plan, computed, rank, parent, chunked_prefill=False):
    relayout = rank_relayout(plan, computed, rank)
    positions = torch.from_numpy(relayout.stage_positions)
    return relayout, pcp_stage_metadata(plan, parent.common, computed, relayout, positions,
                                        chunked_prefill=chunked_prefill)


def _assert_scheduled_alone(stage, expected, rows):
    for name in REQUEST_FIELDS:
        got, want = getattr(stage, name), getattr(expected.common, name)
        assert got.dtype == want.dtype, name
        assert torch.equal(got, want), (name, got, want)
    for name in SCALAR_FIELDS:
        assert getattr(stage, name) == getattr(expected.common, name), name
    assert torch.equal(stage.positions, torch.from_numpy(expected.positions))
    assert stage.positions.shape[0] == rows
    assert stage.slot_mapping is None and stage.prefill_context_parallel_metadata is None


CASES = [
    # (scheduled, computed, pcp): prefix hits of different lengths, one long request,
    # leading decodes, a one-token tail after the cut
    ([96, 40, 120, 64], [0, 32, 200, 16], 4),
    ([700], [128], 8),
    ([1, 1, 90, 33], [40, 7, 0, 5], 2),
    ([31, 2, 1], [0, 9, 3], 2),
    ([5, 300, 12, 1, 1], [0, 64, 0, 30, 9], 4),
]


@pytest.mark.parametrize(("scheduled", "computed", "pcp"), CASES)
@pytest.mark.parametrize("chunked_prefill", [False, True])
def test_each_stage_equals_its_pieces_scheduled_alone(scheduled, computed, pcp, chunked_prefill):
    plan = _plan(scheduled, computed, pcp)
    assert plan.is_split
    for rank in range(pcp):
        parent = runner_batch(scheduled, computed, pcp, rank, block_size=BLOCK,
                              chunked_prefill=chunked_prefill)
        before = {name: getattr(parent.common, name).clone() for name in REQUEST_FIELDS}
        relayout, stages = _stages(plan, computed, rank, parent, chunked_prefill)
        for stage, tokens, rows in zip(stages, stage_tokens(plan, computed),
                                       relayout.stage_row_counts, strict=True):
            requests = slice(tokens.request_start,
                             tokens.request_start + len(tokens.num_scheduled_tokens))
            expected = runner_batch(tokens.num_scheduled_tokens, tokens.num_computed_tokens, pcp,
                                    rank, block_size=BLOCK, chunked_prefill=chunked_prefill,
                                    block_table=parent.common.block_table_tensor[requests],
                                    global_slots=np.zeros(tokens.num_tokens, np.int64))
            _assert_scheduled_alone(stage, expected, rows)
        for name, value in before.items():  # the parent is never mutated
            assert torch.equal(getattr(parent.common, name), value), name


def test_random_batches_match_the_runner_model():
    rng = np.random.default_rng(21)
    checked = 0
    for _ in range(60):
        pcp = int(rng.choice([2, 4, 8]))
        count = int(rng.integers(1, 6))
        scheduled = rng.integers(1, 80, size=count)
        if rng.random() < 0.3:
            scheduled[: int(rng.integers(0, count + 1))] = 1
        computed = rng.integers(0, 100, size=count)
        plan = _plan(scheduled, computed, pcp, align=int(rng.choice([1, 2 * pcp])))
        if not plan.is_split or (scheduled == 1).all():  # a decode-only parent is not split
            continue
        rank = int(rng.integers(0, pcp))
        parent = runner_batch(scheduled, computed, pcp, rank, block_size=BLOCK)
        relayout, stages = _stages(plan, computed, rank, parent)
        for stage, tokens, rows in zip(stages, stage_tokens(plan, computed),
                                       relayout.stage_row_counts, strict=True):
            requests = slice(tokens.request_start,
                             tokens.request_start + len(tokens.num_scheduled_tokens))
            expected = runner_batch(tokens.num_scheduled_tokens, tokens.num_computed_tokens, pcp,
                                    rank, block_size=BLOCK,
                                    block_table=parent.common.block_table_tensor[requests],
                                    global_slots=np.zeros(tokens.num_tokens, np.int64))
            _assert_scheduled_alone(stage, expected, rows)
            checked += 1
    assert checked > 40


def test_a_tail_inside_a_request_is_a_continuation():
    plan = _plan([700], [128], 8)
    parent = runner_batch([700], [128], 8, 3, block_size=BLOCK)
    _, (head, tail) = _stages(plan, [128], 3, parent)
    cut = plan.ubatches[0].num_real_tokens
    assert head.num_computed_tokens_cpu.tolist() == [128]
    assert tail.num_computed_tokens_cpu.tolist() == [128 + cut]
    states = attn_state_enum(LAYOUT)
    assert head.attn_state == tail.attn_state == states.PrefillCacheHit
    fresh = _stages(_plan([700], [0], 8), [0], 3, runner_batch([700], [0], 8, 3,
                                                               block_size=BLOCK))[1]
    assert [stage.attn_state for stage in fresh] == [states.PrefillNoCache,
                                                     states.PrefillCacheHit]


def _parent(**changes):
    parent = runner_batch([96, 40], [0, 8], 2, 0, block_size=BLOCK)
    for name, value in changes.items():
        setattr(parent.common, name, value)
    return parent


@pytest.mark.parametrize(("changes", "match"), [
    ({"graph_pad_size": 8}, "graph_pad_size"),
    ({"actual_seq_lengths_q": [48, 68]}, "actual_seq_lengths_q is set under PCP"),
    ({"num_reqs": 3}, "parent num_reqs=3"),
    ({"dcp_local_seq_lens": torch.zeros(2)}, "dcp_local_seq_lens"),
])
def test_what_a_pcp_stage_cannot_honour_fails_closed_by_name(changes, match):
    plan = _plan([96, 40], [0, 8], 2)
    with pytest.raises(UnsupportedSplitError, match=match):
        _stages(plan, [0, 8], 0, _parent(**changes))


def test_a_decode_only_parent_is_not_split():
    plan = _plan([96, 40], [0, 8], 2)
    parent = _parent(attn_state=attn_state_enum(LAYOUT).DecodeOnly)
    with pytest.raises(UnsupportedSplitError, match="only prefill states"):
        _stages(plan, [0, 8], 0, parent)


def test_the_v0_26_layout_is_refused_under_pcp():
    from afd_split.engine.standins import standin_class

    later = ASCEND_LAYOUTS[-1]
    assert later.version != LAYOUT.version
    parent = _parent()
    values = {name: getattr(parent.common, name) for name in LAYOUT.fields
              if name in later.field_set}
    common = standin_class(later)(**values)
    plan = _plan([96, 40], [0, 8], 2)
    relayout = rank_relayout(plan, [0, 8], 0)
    with pytest.raises(UnsupportedSplitError, match="model runner v2"):
        pcp_stage_metadata(plan, common, [0, 8], relayout,
                           torch.from_numpy(relayout.stage_positions), chunked_prefill=False)


def test_wrong_rank_rows_are_caught_by_the_read_back(monkeypatch):
    """Fault injection: a stage whose seq_lens lose the rank-rows convention."""
    original = ascend_pcp._recomputed

    def broken(common, stage, chunked_prefill):
        values = original(common, stage, chunked_prefill)
        values["_seq_lens_cpu"] = values["_seq_lens_cpu"] + 1
        return values

    monkeypatch.setattr(ascend_pcp, "_recomputed", broken)
    plan = _plan([96, 40], [0, 8], 2)
    with pytest.raises(UnsupportedSplitError, match="is not the pieces' computed tokens"):
        _stages(plan, [0, 8], 1, _parent())


def test_a_tail_not_advanced_past_its_head_is_caught(monkeypatch):
    """Fault injection: the pieces' computed tokens miss the head's share."""
    original = ascend_pcp.stage_tokens

    def unadvanced(plan, computed):
        stages = list(original(plan, computed))
        tail = stages[1]
        stages[1] = type(tail)(tail.index, tail.request_start, tail.token_start,
                               tail.num_scheduled_tokens,
                               np.asarray(computed)[tail.request_start:][
                                   :len(tail.num_scheduled_tokens)])
        return tuple(stages)

    monkeypatch.setattr(ascend_pcp, "stage_tokens", unadvanced)
    plan = _plan([700], [128], 8)
    assert plan.boundary_request == 0
    with pytest.raises(SplitInvariantError):
        _stages(plan, [128], 0, runner_batch([700], [128], 8, 0, block_size=BLOCK))
