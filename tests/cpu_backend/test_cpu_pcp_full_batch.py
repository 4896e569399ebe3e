"""The CPU PCP emulation writes the dense layers' KV with the full batch's slots, read back
after the stage builds (``pytest_afd.backends.cpu.pcp_builders``): a stage build that leaks
into the full batch's slots loses real tokens' KV in the dense layers and moves the logits."""

import numpy as np
import pytest
import torch
from cpu_runner import Runner, make_prompts

from afd_split import SplitConstraints, plan_split
from afd_split.pcp.stage import stage_tokens
from pytest_afd.faults import get_fault

LENGTHS = [150, 37, 260]
PCP = 2


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(LENGTHS)


@pytest.fixture(scope="module")
def unsplit(reduced_model, prompts):
    out, _ = Runner(reduced_model).whole(prompts)
    return out


def test_the_cut_leaves_a_head_piece_off_the_pcp_unit():
    plan = plan_split(LENGTHS, policy="token_balanced",
                      constraints=SplitConstraints(pcp_size=PCP))
    head = stage_tokens(plan, np.zeros(len(LENGTHS), dtype=np.int64))[0].num_scheduled_tokens[-1]
    assert plan.boundary_request is not None and head % (2 * PCP)


def test_the_dense_layers_read_the_full_batchs_slots(reduced_model, prompts, unsplit):
    assert reduced_model.config.first_k_dense_replace > 0  # there are dense layers
    out, _ = Runner(reduced_model).whole(prompts, "token_balanced",
                                         SplitConstraints(pcp_size=PCP))
    torch.testing.assert_close(out.last_logits, unsplit.last_logits)


def test_a_stage_build_writing_through_the_full_batchs_slot_buffer_moves_the_logits(
        reduced_model, prompts, unsplit):
    with get_fault("stage_build_shares_builder_slot_buffer").applied():
        out, _ = Runner(reduced_model).whole(prompts, "token_balanced",
                                             SplitConstraints(pcp_size=PCP))
    assert not torch.allclose(out.last_logits, unsplit.last_logits, atol=1e-3)
