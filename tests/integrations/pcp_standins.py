"""A stand-in of vLLM-Ascend v0.19.1rc1's ``PCPManager`` and the runner state the stage rebuild reads.

Facts (vllm-ascend v0.19.1rc1 da421afad719, ``vllm_ascend/worker/pcp_utils.py``):
``query_lens_pcp_full`` is a CPU/device buffer of ``max_num_reqs`` entries that
``init_batch_info`` fills with the counts it is given (zeros after them);
``update_tokens_for_pcp`` returns this rank's rows per request and keeps the
batch's unpad mask as manager state; ``generate_pcp_metadata`` takes
``num_actual_tokens_pcp_padded`` from its first argument times pcp, the global
counts from ``query_lens_pcp_full``, and the context lengths from
``input_batch.num_computed_tokens_cpu`` read from index 0 (decodes add their
scheduled token); ``get_padded_slot_mapping`` places the given slots at the
unpad mask of the persistent per-group buffer ``pcp_padded_slot_mapping_list[gid]``
(``initialize_slot_mapping``; not restored by the plugin's snapshot) and returns a
view of its first ``num_tokens_padded * pcp`` entries. The helper
maths is the independent reference ``tests/afd_split/pcp_helper_reference.py``;
the plugin's ``snapshot_pcp_manager_state`` / ``restore_pcp_manager_state``
(afd-plugin release/v0.19.1rc1 ``pcp_debug.py``) are ``snapshot`` / ``restore``.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from afd_split.engine.standin_builders import PaddedSlotBuffer
from tests.adapters.pcp_runner_model import rank_positions
from tests.afd_split.pcp_helper_reference import helper_layout, helper_metadata

MAX_NUM_REQS = 32
MAX_NUM_TOKENS = 8192
"""``max_num_batched_tokens`` of the stand-in runner (the cases stay below it)."""


class CpuGpuBuffer:
    """vLLM's CpuGpuBuffer as the manager uses it: ``cpu`` / ``gpu`` tensors, ``copy_to_gpu``."""

    def __init__(self, size: int) -> None:
        self.cpu = torch.zeros(size, dtype=torch.int32)
        self.gpu = torch.zeros(size, dtype=torch.int32)

    def copy_to_gpu(self) -> None:
        self.gpu.copy_(self.cpu)


class StandInPcpManager:
    def __init__(self, pcp: int, rank: int) -> None:
        self.pcp, self.rank = pcp, rank
        self.query_lens_pcp_full = CpuGpuBuffer(MAX_NUM_REQS)
        self.num_reqs = 0
        self.unpad_mask: list[bool] = []
        # initialize_slot_mapping: one persistent int32 buffer per KV-cache group, sized
        # like full_indices (max tokens * pcp + 2 * pcp * max_num_reqs).
        self.padded_slots = [PaddedSlotBuffer(MAX_NUM_TOKENS * pcp + 2 * pcp * MAX_NUM_REQS)]
        self.pcp_padded_slot_mapping_list = [slots.buffer for slots in self.padded_slots]

    def init_batch_info(self, num_scheduled_tokens, num_reqs: int) -> None:
        self.num_reqs = num_reqs
        self.query_lens_pcp_full.cpu[:num_reqs] = torch.as_tensor(
            np.asarray(num_scheduled_tokens[:num_reqs]), dtype=torch.int32)
        self.query_lens_pcp_full.cpu[num_reqs:] = 0
        self.query_lens_pcp_full.copy_to_gpu()

    def update_tokens_for_pcp(self, num_scheduled_tokens, arange_np):
        scheduled = [int(n) for n in num_scheduled_tokens[:self.num_reqs]]
        layout = helper_layout(scheduled, self.pcp)
        self.unpad_mask = layout["unpad_mask"]
        rows, positions = rank_positions(scheduled, [0] * len(scheduled), self.pcp, self.rank)
        return np.array(rows, dtype=np.int32), positions

    def generate_pcp_metadata(self, total_num_scheduled_tokens, query_lens, input_batch,
                              num_scheduled_tokens, block_table_tensor, num_reqs_padded,
                              num_reqs):
        scheduled = self.query_lens_pcp_full.cpu[:num_reqs].tolist()
        computed = [int(c) for c in input_batch.num_computed_tokens_cpu[:num_reqs]]
        metadata = helper_metadata(scheduled, computed, self.pcp, self.rank)
        metadata["num_actual_tokens_pcp_padded"] = total_num_scheduled_tokens * self.pcp
        metadata["query_lens_pcp_full_cpu"] = self.query_lens_pcp_full.cpu[:num_reqs_padded]
        metadata["num_computed_tokens_of_pcp_dcp"] = np.array(
            metadata["num_computed_tokens_of_pcp_dcp"], dtype=np.int32)[:, :, None]
        return SimpleNamespace(**metadata), block_table_tensor

    def get_padded_slot_mapping(self, num_tokens, num_tokens_padded, slot_mapping,
                                kv_cache_group_id):
        """A view of the group's persistent padded-slot buffer (``PaddedSlotBuffer``)."""
        return self.padded_slots[kv_cache_group_id].padded(
            num_tokens, num_tokens_padded, self.pcp, self.unpad_mask, slot_mapping)

    def snapshot(self) -> dict:
        return {"num_reqs": self.num_reqs, "unpad_mask": list(self.unpad_mask),
                "query_lens": self.query_lens_pcp_full.cpu.clone()}

    def restore(self, state: dict) -> None:
        self.num_reqs, self.unpad_mask = state["num_reqs"], state["unpad_mask"]
        self.query_lens_pcp_full.cpu.copy_(state["query_lens"])
        self.query_lens_pcp_full.copy_to_gpu()


def block_tables(global_slots: np.ndarray, slack: int = 1024):
    """``input_batch.block_table`` of one KV-cache group: ``[0].slot_mapping.gpu`` holds the
    batch's global (pre-PCP) slots in a longer buffer."""
    buffer = torch.full((len(global_slots) + slack,), -7, dtype=torch.int64)
    buffer[:len(global_slots)] = torch.from_numpy(np.array(global_slots, dtype=np.int64))
    return [SimpleNamespace(slot_mapping=SimpleNamespace(gpu=buffer))]
