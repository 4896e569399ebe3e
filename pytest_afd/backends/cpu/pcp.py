"""The CPU backend's PCP emulation: every split stage's rows go through afd_split's stage-PCP code.

One process stands for the ``pcp_size`` ranks: each stage's input rows are
taken rank by rank from the stage's own zigzag, all-gathered and restored
with the stage's restore index (``afd_split.pcp_rows``), exactly the layout
vLLM-Ascend's PCP helper gives that stage scheduled alone. The rows enter
through ``gather_ubatch_rows`` (the non-PCP path's gather) and come back to the
plan's row layout, so a fault in either changes the outputs.
"""

from __future__ import annotations

import numpy as np

from afd_split.constraints import MIN_PCP_FOR_ZIGZAG
from afd_split.pcp_rows import gathered_stage_rows
from afd_split.pcp_stage import StageRows, stage_rows


def pcp_rows_for(plan, metadata) -> StageRows | None:
    """The plan's per-stage PCP rows (None when the plan has no PCP)."""
    if plan.constraints.pcp_size < MIN_PCP_FOR_ZIGZAG:
        return None
    return stage_rows(plan, metadata.num_computed_tokens, plan.constraints.pcp_size)


def stage_input_rows(rows: StageRows, plan, index: int, planner_rows, pad_value):
    """Stage ``index``'s input rows through the emulated ranks' all-gather and restore.

    ``planner_rows`` are the ubatch's rows as ``gather_ubatch_rows`` lays them out;
    its real tokens (``real_row_indices``) go rank by rank through the stage's
    zigzag, the all-gather and the restore index, and the restored real tokens
    (the stage's unpad mask) back to the plan's real rows. A leading one-token
    piece, which the helper copies on every rank as a decode, keeps its first
    copy as the real one.
    """
    import torch

    real_rows = torch.from_numpy(np.array(plan.ubatches[index].real_row_indices, dtype=np.int64))
    layout = rows.stages[index]
    gathered = gathered_stage_rows(layout, planner_rows[real_rows], pad_value)
    out = torch.full_like(planner_rows, pad_value)
    out[real_rows] = gathered[torch.from_numpy(layout.unpad_mask)]
    return out
