"""vLLM ``CommonAttentionMetadata`` <-> ``BatchMetadata``.

Targets the field layout of the vLLM release that vLLM-Ascend pins for the AFD
recipe, where the CPU copies are dataclass fields (``PINNED_COMMON_FIELDS``).
Later releases turned ``seq_lens_cpu`` / ``num_computed_tokens_cpu`` into
deprecated properties; the drift test in tests/afd_split checks the installed
vLLM against this list so a layout change fails loudly instead of silently.
Positions are not part of ``CommonAttentionMetadata`` (the model runner holds
them), so they travel next to it. This path reads slot_mapping and the block
table to the host so every ubatch can be validated: right for the CPU harness
and for debugging production batches; a device-resident slicing path (views of
the device tensors by the plan's slices) is the follow-up for the hot path.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from afd_split.metadata import BatchMetadata, split_metadata
from afd_split.plan import SplitPlan

PINNED_COMMON_FIELDS = (
    "query_start_loc",
    "query_start_loc_cpu",
    "seq_lens",
    "seq_lens_cpu",
    "num_computed_tokens_cpu",
    "num_reqs",
    "num_actual_tokens",
    "max_query_len",
    "max_seq_len",
    "block_table_tensor",
    "slot_mapping",
)
"""CommonAttentionMetadata fields this adapter reads and writes."""


def common_attention_metadata_type() -> type:
    """vLLM's ``CommonAttentionMetadata`` class (imports vLLM)."""
    from vllm.v1.attention.backends.utils import CommonAttentionMetadata  # lazy: optional dep

    return CommonAttentionMetadata


def _to_numpy(tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy().astype(np.int64)


def batch_metadata_from_common(common, positions, block_size: int) -> BatchMetadata:
    """Read the real-token part of ``common`` (vLLM may pad slot_mapping / query_start_loc)."""
    num_reqs = common.num_reqs
    num_tokens = common.num_actual_tokens
    positions = _to_numpy(positions)
    return BatchMetadata(
        query_start_loc=_to_numpy(common.query_start_loc_cpu[: num_reqs + 1]),
        seq_lens=_to_numpy(common.seq_lens_cpu[:num_reqs]),
        num_computed_tokens=_to_numpy(common.num_computed_tokens_cpu[:num_reqs]),
        slot_mapping=_to_numpy(common.slot_mapping[:num_tokens]),
        block_table=_to_numpy(common.block_table_tensor[:num_reqs]),
        positions=positions[..., :num_tokens],
        block_size=block_size,
    )


def common_from_batch_metadata(metadata: BatchMetadata, template):
    """A copy of ``template`` carrying ``metadata``; dtypes and devices follow the template."""
    import torch  # lazy: only adapters touch tensors

    def like(array: np.ndarray, reference):
        return torch.from_numpy(array.copy()).to(dtype=reference.dtype, device=reference.device)

    return dataclasses.replace(
        template,
        query_start_loc=like(metadata.query_start_loc, template.query_start_loc),
        query_start_loc_cpu=like(metadata.query_start_loc, template.query_start_loc_cpu),
        seq_lens=like(metadata.seq_lens, template.seq_lens),
        seq_lens_cpu=like(metadata.seq_lens, template.seq_lens_cpu),
        num_computed_tokens_cpu=like(
            metadata.num_computed_tokens, template.num_computed_tokens_cpu
        ),
        num_reqs=metadata.num_reqs,
        num_actual_tokens=metadata.num_tokens,
        max_query_len=metadata.max_query_len,
        max_seq_len=metadata.max_seq_len,
        block_table_tensor=like(metadata.block_table, template.block_table_tensor),
        slot_mapping=like(metadata.slot_mapping, template.slot_mapping),
    )


def split_common_metadata(plan: SplitPlan, common, positions, block_size: int):
    """Per-ubatch ``(CommonAttentionMetadata, positions)`` pairs for a plan, validated."""
    import torch  # lazy: only adapters touch tensors

    parent = batch_metadata_from_common(common, positions, block_size)
    parts = split_metadata(plan, parent, validate=True)
    return [
        (
            common_from_batch_metadata(part, common),
            torch.from_numpy(part.positions.copy()).to(
                dtype=positions.dtype, device=positions.device
            ),
        )
        for part in parts
    ]
