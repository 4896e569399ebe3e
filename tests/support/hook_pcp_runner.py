"""The release/v0.19.1rc1 stand-in runner under PCP, shared by the hook's PCP tests
(tests/integrations/test_hook_pcp*.py, test_upstream_request_split_pcp.py): a hook session
factory, a runner holding one rank's batch, and its builders and full-batch slots."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from afd_split.engine.standin_builders import (
    StandInAttentionGroup,
    StandInMlaCpBuilder,
    StandInSfaCpBuilder,
)
from afd_split.hook.facts.drift_guard import TOKEN_BALANCED_SPLIT
from afd_split.hook.planning.engine_step import StepRanks
from afd_split.hook.planning.stages import HookSession
from afd_split.hook.planning.worker_evidence import EvidenceWriter
from tests.support.hook_standins import BLOCK_SIZE
from tests.support.pcp_runner_model import runner_batch
from tests.support.pcp_standins import MAX_NUM_TOKENS, StandInPcpManager, block_tables

RELEASE = "release/v0.19.1rc1"


def session_factory(evidence_dir, alignment, pcp_rank=1, min_split_tokens=0):
    def new_session(runner) -> HookSession:
        return HookSession(ranks=StepRanks(global_rank=0, pcp_rank=pcp_rank), groups=[],
                           splitter=lambda *a: pytest.fail("PCP stages never reach the adapter"),
                           writer=None if evidence_dir is None else EvidenceWriter(
                               evidence_dir, "attention-rank0"),
                           alignment=alignment,
                           pcp_all_to_all=lambda rows, send, recv: pytest.fail(
                               "no rows move while metadata is built"),
                           min_split_tokens=min_split_tokens)

    return new_session


def pcp_runner(seams, scheduled, computed, pcp, rank):
    batch = runner_batch(scheduled, computed, pcp, rank, block_size=BLOCK_SIZE)
    runner = seams.runner_class()
    runner.use_cp = True
    runner.afd_async_extra_info = SimpleNamespace(async_moe_split=TOKEN_BALANCED_SPLIT)
    computed_tensor = torch.tensor(computed, dtype=torch.int32)
    runner.input_batch = SimpleNamespace(num_computed_tokens_cpu_tensor=computed_tensor,
                                         num_computed_tokens_cpu=computed_tensor.numpy(),
                                         req_ids=[f"cmpl-q{i}-0" for i in range(len(scheduled))],
                                         block_table=block_tables(batch.global_slots))
    runner.cache_config = SimpleNamespace(block_size=BLOCK_SIZE)
    runner.common = batch.common
    runner.long_seq_metadata = "full-batch"
    runner.pcp_manager = StandInPcpManager(pcp, rank)
    runner.pcp_manager.init_batch_info(np.asarray(scheduled), len(scheduled))
    runner.connector = SimpleNamespace()  # the plugin's connector (the expert-load recorder's home)
    return runner, batch


def _builders(kind: str, pcp: int) -> list:
    if kind == "sfa_cp":
        return [StandInSfaCpBuilder(max_num_batched_tokens=MAX_NUM_TOKENS, max_num_seqs=32,
                                    pcp_size=pcp) for _ in range(2)]
    return [StandInMlaCpBuilder(pcp_size=pcp) for _ in range(2)]


def global_slots(runner) -> np.ndarray:
    return runner.input_batch.block_table[0].slot_mapping.gpu.numpy()


def configure_builders(runner, kind, scheduled, pcp):
    """Builders, the PCP manager's full-batch mask, and the full batch's padded slots."""
    slots = torch.from_numpy(global_slots(runner)[:int(np.sum(scheduled))].copy())
    manager = runner.pcp_manager
    manager.update_tokens_for_pcp(np.asarray(scheduled), None)
    rows = int(runner.common.num_actual_tokens)
    runner.attn_groups = [[StandInAttentionGroup(_builders(kind, pcp))]]

    def full_batch_slots():
        return manager.get_padded_slot_mapping(rows, rows, slots, 0)

    def full_batch_common():
        full = copy.copy(runner.common)
        full.slot_mapping = full_batch_slots()
        return full

    runner.full_batch_slots = full_batch_slots
    runner.full_batch_common = full_batch_common
