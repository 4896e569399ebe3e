"""Rows of a split stage under PCP: each rank's own rows, their all-gather and its restore.

``afd_split.pcp.stage.stage_rows`` says which token each rank holds in every
stage's own zigzag. These functions move real data along it the way the
engine does: every rank takes its rows (``rank_rows``), the PCP all-gather
concatenates the ranks, and the stage's ``allgather_restore_idx`` puts the
result back in padded request order, which is the planner's PCP row layout
of the stage (each piece padded to 2 * pcp). The CPU backend runs every split
under PCP through them, so a wrong layout or restore index changes its output.
"""

from __future__ import annotations

import numpy as np

from afd_split.pcp.stage import PAD_TOKEN, ZigzagLayout


def rank_rows(layout: ZigzagLayout, rank: int, stage_rows, pad_value=0):
    """Rank ``rank``'s rows of a stage, taken from the stage's real rows [num tokens, ...] in
    logical order (padding rows filled with ``pad_value``)."""
    sources = layout.rank_sources[rank]
    real = sources != PAD_TOKEN
    shape = (len(sources), *tuple(stage_rows.shape[1:]))
    if isinstance(stage_rows, np.ndarray):
        out = np.full(shape, pad_value, dtype=stage_rows.dtype)
        out[real] = stage_rows[sources[real]]
        return out
    import torch  # lazy: numpy callers never pay for it

    out = stage_rows.new_full(shape, pad_value)
    out[torch.from_numpy(np.flatnonzero(real))] = stage_rows[torch.from_numpy(sources[real])]
    return out


def gathered_stage_rows(layout: ZigzagLayout, stage_rows, pad_value=0):
    """The stage's rows after the PCP all-gather and restore: padded request order [rows, ...]."""
    per_rank = [rank_rows(layout, rank, stage_rows, pad_value) for rank in range(layout.pcp_size)]
    restore = layout.allgather_restore_idx
    if isinstance(stage_rows, np.ndarray):
        return np.concatenate(per_rank)[restore]
    import torch

    return torch.cat(per_rank)[torch.from_numpy(restore)]
