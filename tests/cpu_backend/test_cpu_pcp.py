"""The CPU backend's PCP emulation runs every split stage through afd_split's stage-PCP code."""

import numpy as np
import pytest
import torch
from cpu_runner import Runner, make_prompts

from afd_split import SplitConstraints, gather_ubatch_rows, pcp_stage
from pytest_afd.backends.cpu.pcp import pcp_rows_for, stage_input_rows

LENGTHS = [150, 37, 260]


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(LENGTHS)


@pytest.fixture(scope="module")
def unsplit(reduced_model, prompts):
    out, _ = Runner(reduced_model).whole(prompts)
    return out


@pytest.mark.parametrize("pcp", [2, 8])
def test_pcp_split_cut_inside_a_request_matches_unsplit(reduced_model, prompts, unsplit, pcp):
    out, plan = Runner(reduced_model).whole(prompts, "token_balanced",
                                            SplitConstraints(pcp_size=pcp))
    assert plan.boundary_request is not None  # the cut is inside a request
    torch.testing.assert_close(out.last_logits, unsplit.last_logits)


def test_a_wrong_restore_index_is_caught_by_the_outputs(reduced_model, prompts, unsplit,
                                                        monkeypatch):
    honest = pcp_stage.ZigzagLayout.allgather_restore_idx.fget

    def shifted(layout):  # fault: every restored row one place off
        return np.roll(honest(layout), 1)

    monkeypatch.setattr(pcp_stage.ZigzagLayout, "allgather_restore_idx", property(shifted))
    out, _ = Runner(reduced_model).whole(prompts, "token_balanced", SplitConstraints(pcp_size=2))
    assert not torch.allclose(out.last_logits, unsplit.last_logits, atol=1e-3)


def _batch(lengths, computed):
    from afd_split import BatchMetadata

    counts = np.asarray(lengths)
    seq = counts + np.asarray(computed)
    qsl = np.concatenate([[0], np.cumsum(counts)])
    positions = np.concatenate([np.arange(c, s) for c, s in zip(computed, seq, strict=True)])
    blocks = -(-seq.max() // 16)
    table = np.arange(len(counts) * blocks).reshape(len(counts), blocks)
    slots = np.concatenate([table[i, p // 16] * 16 + p % 16 for i, p in enumerate(
        np.split(positions, np.cumsum(counts)[:-1]))])
    return BatchMetadata(qsl, seq, np.asarray(computed), slots, table, positions, block_size=16)


def test_leading_one_token_piece_keeps_its_real_copy():
    from afd_split import plan_split

    metadata = _batch([1, 60], [30, 0])  # a leading decode-like request under PCP
    plan = plan_split([1, 60], policy="token_balanced", constraints=SplitConstraints(pcp_size=2))
    rows = pcp_rows_for(plan, metadata)
    assert rows.stages[0].num_decode_reqs == 1
    ids = torch.arange(61) + 100
    for index, ubatch in enumerate(plan.ubatches):
        planner = gather_ubatch_rows(plan, index, ids, pad_value=-1)
        stage = stage_input_rows(rows, plan, index, planner, -1)
        assert torch.equal(stage, planner)  # the all-gather and restore give the plan's rows
        real = stage[torch.from_numpy(np.array(ubatch.real_row_indices))]
        assert real.tolist() == ids[ubatch.token_slice].tolist()
        assert (stage == -1).sum() == ubatch.num_padded_tokens
