"""The token-level check of an adapter's split (``check="full"``): debugging only.

API: ``validate_token_level(plan, common, positions, block_size, parent, results,
slot_rows_padded=False)``.

It copies slot_mapping, the block table and positions of the parent and of
every produced ubatch to the host (device-to-host transfers the per-step
``"requests"`` check avoids) and runs ``afd_split.validate_split`` on them, so
what is judged is what the adapter produced, read back from its objects.
"""

from __future__ import annotations

import numpy as np

from afd_split.checks.metadata import BatchMetadata, validate_split
from afd_split.checks.requests import RequestFields
from afd_split.errors import SplitInvariantError
from afd_split.plan.planner import SplitPlan


def _host(tensor) -> np.ndarray:
    """int64 host copy of a tensor (a device-to-host transfer on a device tensor)."""
    if isinstance(tensor, np.ndarray):
        return tensor.astype(np.int64)
    return tensor.detach().cpu().numpy().astype(np.int64)


def _metadata(fields: RequestFields, slots, block_table, positions, block_size) -> BatchMetadata:
    num_reqs, num_tokens = fields.num_reqs, fields.num_tokens
    return BatchMetadata(
        query_start_loc=fields.query_start_loc,
        seq_lens=fields.seq_lens,
        num_computed_tokens=fields.num_computed_tokens,
        slot_mapping=_host(slots)[..., :num_tokens],
        block_table=_host(block_table)[:num_reqs],
        positions=_host(positions)[..., :num_tokens],
        block_size=block_size,
    )


def validate_token_level(
    plan: SplitPlan, common, positions, block_size: int, parent: tuple, results
) -> None:
    """``validate_split`` over the parent and the produced ``(metadata, positions)`` pairs.

    ``parent`` is the parent's real-request host arrays ``(qsl, seq_lens, computed)``.
    Each ubatch's real rows are read at ``UBatch.real_row_indices`` (its padding
    rows, if any, are skipped), so the same check serves padded Ascend ubatches.
    """
    parent = RequestFields(*parent)
    parent_meta = _metadata(
        parent, common.slot_mapping, common.block_table_tensor, positions, block_size
    )
    parts = []
    for ubatch, (sub, sub_positions) in zip(plan.ubatches, results, strict=True):
        rows = ubatch.real_row_indices
        host_qsl = sub.query_start_loc_cpu.numpy()
        device_qsl = _host(sub.query_start_loc)
        if not np.array_equal(device_qsl, host_qsl):
            raise SplitInvariantError(
                f"ubatch {ubatch.index}: device query_start_loc {device_qsl.tolist()[:8]} != "
                f"host query_start_loc_cpu {host_qsl.tolist()[:8]}"
            )
        host_seq = _host(sub.seq_lens)
        fields = RequestFields(host_qsl, host_seq, host_seq - np.diff(host_qsl))
        slots = _host(sub.slot_mapping)
        sub_pos = _host(sub_positions)
        if slots.shape[-1] > ubatch.num_real_tokens:
            slots = slots[..., rows]
        if sub_pos.shape[-1] > ubatch.num_real_tokens:
            sub_pos = sub_pos[..., rows]
        parts.append(_metadata(fields, slots, sub.block_table_tensor, sub_pos, block_size))
    validate_split(plan, parent_meta, parts)
