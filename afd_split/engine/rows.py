"""Moving token-indexed rows between the parent batch and the ubatches' padded layouts.

Works on numpy arrays and torch tensors alike (first dimension = rows), so the
same plan drives CPU reference runs and device tensors.
"""

from __future__ import annotations

import numpy as np

from afd_split.plan.planner import SplitPlan, UBatch


def _is_numpy(rows) -> bool:
    return isinstance(rows, np.ndarray)


def _index_for(ubatch: UBatch, like):
    """The ubatch's real-row indices as an index object for ``like``'s library and device."""
    if _is_numpy(like):
        return ubatch.real_row_indices
    import torch  # lazy: only when the caller passes tensors

    return torch.from_numpy(ubatch.real_row_indices.copy()).to(like.device)


def gather_ubatch_rows(plan: SplitPlan, ubatch_index: int, parent_rows, pad_value=0):
    """Parent token-indexed rows [T, ...] -> ubatch ``ubatch_index``'s padded rows [rows, ...].

    Padding rows are filled with ``pad_value``; real rows keep their logical order.
    """
    ubatch = plan.ubatches[ubatch_index]
    if parent_rows.shape[0] != plan.num_tokens:
        raise ValueError(
            f"parent_rows has {parent_rows.shape[0]} rows but the plan has {plan.num_tokens} tokens"
        )
    real = parent_rows[ubatch.token_slice]
    shape = (ubatch.num_rows, *tuple(parent_rows.shape[1:]))
    if _is_numpy(parent_rows):
        padded = np.full(shape, pad_value, dtype=parent_rows.dtype)
    else:
        padded = parent_rows.new_full(shape, pad_value)
    if ubatch.real_rows_are_prefix:
        padded[: ubatch.num_real_tokens] = real
    else:
        padded[_index_for(ubatch, parent_rows)] = real
    return padded


def merge_outputs(plan: SplitPlan, outputs):
    """Per-ubatch padded rows -> the real rows of the whole batch in logical token order."""
    outputs = list(outputs)
    if len(outputs) != len(plan.ubatches):
        raise ValueError(f"got {len(outputs)} outputs for {len(plan.ubatches)} ubatches")
    pieces = []
    for ubatch, rows in zip(plan.ubatches, outputs, strict=True):
        if rows.shape[0] != ubatch.num_rows:
            raise ValueError(
                f"output of ubatch {ubatch.index} has {rows.shape[0]} rows, expected "
                f"{ubatch.num_rows} ({ubatch.num_real_tokens} real + "
                f"{ubatch.num_padded_tokens} padding)"
            )
        if ubatch.real_rows_are_prefix:
            pieces.append(rows[: ubatch.num_real_tokens])
        else:
            pieces.append(rows[_index_for(ubatch, rows)])
    if all(_is_numpy(piece) for piece in pieces):
        return np.concatenate(pieces)
    if any(_is_numpy(piece) for piece in pieces):
        raise TypeError("merge_outputs needs all outputs as numpy arrays or all as torch tensors")
    import torch

    return torch.cat(pieces)
