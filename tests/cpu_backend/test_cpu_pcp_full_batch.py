"""The CPU PCP emulation writes the dense layers' KV with the full batch's slots, read back
after the stage builds (``pytest_afd.backends.cpu.pcp_builders``): a stage build that leaks
into the full batch's slots loses real tokens' KV in the dense layers and moves the logits."""

from types import SimpleNamespace

import numpy as np
import torch

from afd_split import SplitConstraints, plan_split
from afd_split.pcp.stage import stage_tokens
from pytest_afd.backends.cpu.pcp_builders import changed_fields, full_batch_fields
from pytest_afd.faults.registry import get_fault
from tests.support.cpu_runner import PCP_LENGTHS, Runner

PCP = 2


def test_the_cut_leaves_a_head_piece_off_the_pcp_unit():
    plan = plan_split(PCP_LENGTHS, policy="token_balanced",
                      constraints=SplitConstraints(pcp_size=PCP))
    computed = np.zeros(len(PCP_LENGTHS), dtype=np.int64)
    head = stage_tokens(plan, computed)[0].num_scheduled_tokens[-1]
    assert plan.boundary_request is not None and head % (2 * PCP)


def test_a_stage_build_writing_through_the_full_batchs_slot_buffer_moves_the_logits(
        reduced_model, pcp_prompts, pcp_unsplit):
    # Honest, the same split matches the unsplit run: test_cpu_pcp's pcp=2 case.
    assert reduced_model.config.first_k_dense_replace > 0  # there are dense layers
    with get_fault("stage_build_shares_builder_slot_buffer").applied():
        out, _ = Runner(reduced_model).whole(pcp_prompts, "token_balanced",
                                             SplitConstraints(pcp_size=PCP))
    assert not torch.allclose(out.last_logits, pcp_unsplit.last_logits, atol=1e-3)


def test_a_full_batch_field_changed_in_place_is_named_down_to_each_kv_index():
    pcp = SimpleNamespace(pcp_unpad_mask=np.array([True, False]),
                          kv_idx={"kv_tail_proj_idx_tensor": np.arange(4)})
    full = SimpleNamespace(slot_mapping=torch.arange(3), positions=torch.arange(3),
                           prefill_context_parallel_metadata=pcp)
    before = full_batch_fields(full)
    assert changed_fields(before, full) == []
    pcp.kv_idx["kv_tail_proj_idx_tensor"][1] = 9  # in place: the dict is the same object
    full.slot_mapping[0] = -1
    assert changed_fields(before, full) == ["slot_mapping", "pcp.kv_idx.kv_tail_proj_idx_tensor"]
