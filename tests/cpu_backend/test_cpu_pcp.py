"""The CPU backend's PCP emulation runs every split through the hook's PCP glue on every rank:
the relayout of the rows (``afd_split.pcp.relayout``) and the relaid stage metadata
(``afd_split.engine.ascend_pcp``), so their faults reach the logits."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from afd_split import SplitConstraints
from afd_split.engine.rows import gather_ubatch_rows
from afd_split.pcp import relayout as pcp_relayout
from afd_split.pcp import stage as pcp_stage
from pytest_afd.backends.cpu.pcp import PcpEmulation
from pytest_afd.faults.registry import PCP_ROW_FAULTS, get_fault
from tests.support.cpu_runner import Runner


@pytest.mark.parametrize("pcp", [2, 8])
def test_pcp_split_cut_inside_a_request_matches_unsplit(reduced_model, pcp_prompts, pcp_unsplit,
                                                        pcp):
    out, plan = Runner(reduced_model).whole(pcp_prompts, "token_balanced",
                                            SplitConstraints(pcp_size=pcp))
    assert plan.boundary_request is not None  # the cut is inside a request
    torch.testing.assert_close(out.last_logits, pcp_unsplit.last_logits)


def test_a_wrong_restore_index_is_caught_by_the_outputs(reduced_model, pcp_prompts,
                                                        pcp_unsplit, monkeypatch):
    honest = pcp_stage.ZigzagLayout.allgather_restore_idx.fget

    def shifted(layout):  # fault: every restored row one place off
        return np.roll(honest(layout), 1)

    monkeypatch.setattr(pcp_stage.ZigzagLayout, "allgather_restore_idx", property(shifted))
    out, _ = Runner(reduced_model).whole(pcp_prompts, "token_balanced",
                                         SplitConstraints(pcp_size=2))
    assert not torch.allclose(out.last_logits, pcp_unsplit.last_logits, atol=1e-3)


def _batch(lengths, computed):
    from afd_split.checks.metadata import BatchMetadata

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
    emulation = PcpEmulation(plan, metadata)
    assert emulation.stages[0].num_decode_reqs == 1
    ids = torch.arange(61) + 100
    stages = emulation.stage_inputs(ids, -1)
    for index, ubatch in enumerate(plan.ubatches):
        planner = gather_ubatch_rows(plan, index, ids, pad_value=-1)
        assert torch.equal(stages[index], planner)  # relayout, all-gather, restore: the plan's rows
        real = stages[index][torch.from_numpy(np.array(ubatch.real_row_indices))]
        assert real.tolist() == ids[ubatch.token_slice].tolist()
        assert (stages[index] == -1).sum() == ubatch.num_padded_tokens
    assert torch.equal(emulation.merged(stages), ids)  # and back to the logical rows


def test_the_kernels_read_the_glues_positions_and_computed_tokens():
    from afd_split import plan_split
    from afd_split.checks.metadata import split_metadata

    metadata = _batch([150, 37, 260], [0, 48, 16])
    plan = plan_split([150, 37, 260], policy="token_balanced",
                      constraints=SplitConstraints(pcp_size=4, align=8),
                      num_computed_tokens=[0, 48, 16])
    kernels = PcpEmulation(plan, metadata).kernel_metadata(metadata, chunked_prefill=True)
    for kernel, part in zip(kernels, split_metadata(plan, metadata), strict=True):
        assert np.array_equal(kernel.positions, part.positions)
        assert np.array_equal(kernel.num_computed_tokens, part.num_computed_tokens)
        assert np.array_equal(kernel.block_table, part.block_table)


def _position_off_by_one(relayout):
    positions = relayout.stage_positions.copy()
    positions[len(positions) // 2] += 1
    return replace(relayout, stage_positions=positions)


def test_a_wrong_relaid_position_is_caught_by_the_outputs(reduced_model, pcp_prompts,
                                                          pcp_unsplit, monkeypatch):
    """Fault injection in the glue, on every rank: one relaid row's position off by one."""
    honest = pcp_relayout.all_rank_relayouts
    monkeypatch.setattr("pytest_afd.backends.cpu.pcp.all_rank_relayouts",
                        lambda plan, computed: [_position_off_by_one(relayout)
                                                for relayout in honest(plan, computed)])
    out, _ = Runner(reduced_model).whole(pcp_prompts, "token_balanced",
                                         SplitConstraints(pcp_size=2))
    assert not torch.allclose(out.last_logits, pcp_unsplit.last_logits, atol=1e-3)


@pytest.mark.parametrize("name", PCP_ROW_FAULTS)
def test_the_seeded_relayout_faults_are_caught_by_the_outputs(reduced_model, pcp_prompts,
                                                              pcp_unsplit, name):
    with get_fault(name).applied():
        out, _ = Runner(reduced_model).whole(pcp_prompts, "token_balanced",
                                             SplitConstraints(pcp_size=2))
    assert not torch.allclose(out.last_logits, pcp_unsplit.last_logits, atol=1e-3)
