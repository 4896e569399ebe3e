"""Rows of a split stage under PCP: each rank's own rows, their all-gather and its restore.

``afd_split.pcp_stage.stage_rows`` says which token each rank holds in every
stage's own zigzag. These functions move real data along it the way the
engine does: every rank takes its rows (``rank_rows``), the PCP all-gather
concatenates the ranks, and the stage's ``allgather_restore_idx`` puts the
result back in padded request order, which is the planner's PCP row layout
of the stage (each piece padded to 2 * pcp). The CPU backend runs every split
under PCP through them, so a wrong layout or restore index changes its output.
"""

from __future__ import annotations

import numpy as np

from afd_split.constraints import ZIGZAG_CHUNKS_PER_RANK, round_up
from afd_split.errors import UnsupportedSplitError
from afd_split.pcp_stage import PAD_TOKEN, StageRows, ZigzagLayout
from afd_split.plan_types import SplitPlan


def check_rows_match_plan(plan: SplitPlan, rows: StageRows) -> None:
    """Every stage's zigzag must fill the planner's rows for it (or fail closed, naming why).

    The helper copies a leading 1-token request on every rank (a PCP decode,
    pcp rows) where the planner pads every piece to 2 * pcp rows.
    """
    for ubatch, layout in zip(plan.ubatches, rows.stages, strict=True):
        helper_rows = int(layout.padded_tokens.sum())
        piece_rows = sum(round_up(int(piece), ZIGZAG_CHUNKS_PER_RANK * layout.pcp_size)
                         for piece in layout.num_scheduled_tokens)
        if layout.num_decode_reqs:
            raise UnsupportedSplitError(
                f"ubatch {ubatch.index} starts with {layout.num_decode_reqs} one-token piece(s): "
                f"the PCP helper lays them out as decodes ({helper_rows} rows) where the plan "
                f"gives pieces of 2*pcp rows ({piece_rows})")
        if helper_rows != piece_rows or piece_rows > ubatch.num_rows:
            raise UnsupportedSplitError(
                f"ubatch {ubatch.index}: the PCP helper's layout has {helper_rows} rows, "
                f"the plan's pieces {piece_rows} of its {ubatch.num_rows} rows")


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
