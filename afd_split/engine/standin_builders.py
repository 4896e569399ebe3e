"""Stand-ins of the vLLM-Ascend v0.19.1rc1 PCP metadata builders and their persistent buffers.

They model who owns each buffer and which returned fields are views, exactly as
the pinned code does (vllm-ascend v0.19.1rc1 da421afad719), so a stage build that
writes through a buffer the full batch views changes the full batch here too:

* ``StandInSfaCpBuilder``: ``AscendSFACPMetadataBuilder.build``
  (``vllm_ascend/attention/context_parallel/sfa_cp.py``) copies the common
  metadata's first ``num_actual_tokens_pcp_padded`` slots into its persistent
  ``slot_mapping_buf`` (int32, ``max_num_batched_tokens + 2 * pcp * max_num_seqs``
  entries, made in ``__init__``) and returns ``slot_mapping_buf[:n]``, a view; the
  positions are ``common.positions[:num_input_tokens].long()``
  (``AscendSFAMetadataBuilder.build``, ``attention/sfa_v1.py``).
* ``StandInMlaCpBuilder``: ``AscendMlaCPMetadataBuilder.build``
  (``attention/context_parallel/mla_cp.py``) keeps ``self.slot_mapping =
  common.slot_mapping[:num_actual_tokens]`` (``AscendMLAMetadataBuilder.build``,
  ``attention/mla_v1.py``; ``num_actual_tokens`` = max of the PCP padded rows and
  the common count, ``set_num_actual_tokens``), compacts the decode slots in place
  (every pcp-th entry first, the rest -1) and returns that view: a view of the
  PCP manager's padded-slot buffer.
* ``PaddedSlotBuffer``: ``PCPManager.initialize_slot_mapping`` /
  ``get_padded_slot_mapping`` (``worker/pcp_utils.py``): one int32 buffer per KV-cache
  group (``max_buffer_num_tokens`` entries, -1), filled with -1 and the slots at the
  unpad mask, and returned as a view of its first ``num_tokens_padded * pcp``
  entries.
* ``StandInAttentionGroup``: vLLM's ``AttentionGroup.get_metadata_builder(ubatch_id)``
  over ``metadata_builders`` (two after the plugin's ``_ensure_two_metadata_builders``).

Only what the stage build and the full batch read is modelled; MLAPO and speculative
decode compaction (both refused under token_balanced PCP) are not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

DECODE_THRESHOLD = 1
"""``decode_threshold`` without speculative decoding: a request of one token is a decode."""


@dataclass
class StandInCpMetadata:
    """What the stand-in builders return: the fields the full-batch checks read."""

    slot_mapping: Any
    positions: Any
    prefill_context_parallel_metadata: Any
    num_actual_tokens: int


def num_decode_tokens(common) -> int:
    """Leading decode requests' tokens (``split_decodes_and_prefills``, threshold 1)."""
    query = np.diff(np.asarray(common.query_start_loc_cpu, dtype=np.int64))
    prefill = np.flatnonzero(query > DECODE_THRESHOLD)
    decodes = int(prefill[0]) if len(prefill) else len(query)
    return int(query[:decodes].sum())


class StandInSfaCpBuilder:
    """``AscendSFACPMetadataBuilder`` (sfa_cp.py, v0.19.1rc1 da421af): persistent
    ``slot_mapping_buf``, ``build`` returns a view of it."""

    def __init__(self, *, max_num_batched_tokens: int, max_num_seqs: int, pcp_size: int,
                 device: Any = "cpu") -> None:
        self.pcp_size = pcp_size
        self.slot_mapping_buf = torch.empty(max_num_batched_tokens + 2 * pcp_size * max_num_seqs,
                                            dtype=torch.int32, device=device)

    def build(self, common_prefix_len: int, common_attn_metadata,
              fast_build: bool = False) -> StandInCpMetadata:
        common = common_attn_metadata
        pcp = common.prefill_context_parallel_metadata
        padded = int(pcp.num_actual_tokens_pcp_padded)
        self.slot_mapping_buf[:padded].copy_(common.slot_mapping[:padded])
        return StandInCpMetadata(
            slot_mapping=self.slot_mapping_buf[:padded],
            positions=common.positions[:int(common.num_input_tokens)].long(),
            prefill_context_parallel_metadata=pcp,
            num_actual_tokens=int(common.num_actual_tokens))


class StandInMlaCpBuilder:
    """``AscendMlaCPMetadataBuilder`` (mla_cp.py, v0.19.1rc1 da421af): keeps a view of the
    common slots (the PCP manager's padded-slot buffer), compacts decodes in place."""

    def __init__(self, *, pcp_size: int) -> None:
        self.pcp_size = pcp_size
        self.slot_mapping = None
        self.num_actual_tokens = 0
        self.num_decode_tokens = 0

    def build(self, common_prefix_len: int, common_attn_metadata,
              fast_build: bool = False) -> StandInCpMetadata:
        common = common_attn_metadata
        pcp = common.prefill_context_parallel_metadata
        self.num_actual_tokens = max(int(pcp.num_actual_tokens_pcp_padded),
                                     int(common.num_actual_tokens))
        self.num_decode_tokens = num_decode_tokens(common)
        self.slot_mapping = common.slot_mapping[:self.num_actual_tokens]
        decodes = self.num_decode_tokens
        # Upstream assigns the strided view directly; CPU torch refuses overlapping copies,
        # so the source is cloned first (same values written into the same buffer).
        self.slot_mapping[:decodes] = self.slot_mapping[
            :decodes * self.pcp_size:self.pcp_size].clone()
        self.slot_mapping[decodes:decodes * self.pcp_size].fill_(-1)
        return StandInCpMetadata(
            slot_mapping=self.slot_mapping, positions=common.positions,
            prefill_context_parallel_metadata=pcp, num_actual_tokens=self.num_actual_tokens)


class PaddedSlotBuffer:
    """``PCPManager.pcp_padded_slot_mapping_list[gid]`` and ``get_padded_slot_mapping``
    (pcp_utils.py, v0.19.1rc1 da421af): one persistent buffer, views returned."""

    def __init__(self, max_buffer_num_tokens: int, device: Any = "cpu") -> None:
        self.buffer = torch.full((max_buffer_num_tokens,), -1, dtype=torch.int32, device=device)

    def padded(self, num_tokens: int, num_tokens_padded: int, pcp_size: int, unpad_mask,
               slot_mapping):
        """Fill ``[:num_tokens_padded * pcp]`` with -1 and ``slot_mapping`` at the unpad mask;
        the returned tensor is a view of the buffer."""
        view = self.buffer[:num_tokens_padded * pcp_size]
        view.fill_(-1)
        mask = torch.as_tensor(np.asarray(unpad_mask[:num_tokens * pcp_size], dtype=bool))
        values = (slot_mapping if isinstance(slot_mapping, torch.Tensor)
                  else torch.from_numpy(np.array(slot_mapping)))
        view[:num_tokens * pcp_size][mask] = values.to(view.dtype)
        return view


class StandInAttentionGroup:
    """vLLM's ``AttentionGroup`` as the runners read it: ``metadata_builders`` and
    ``get_metadata_builder(ubatch_id=0)`` (vllm/v1/worker/utils.py, vLLM 0.19.1)."""

    def __init__(self, builders: list) -> None:
        self.metadata_builders = list(builders)

    def get_metadata_builder(self, ubatch_id: int = 0):
        if len(self.metadata_builders) <= ubatch_id:
            raise IndexError(f"ubatch {ubatch_id}: {len(self.metadata_builders)} builders")
        return self.metadata_builders[ubatch_id]
