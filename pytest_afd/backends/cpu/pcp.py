"""The CPU backend's PCP emulation: every split stage's rows go through afd_split's stage-PCP code.

One process stands for the ``pcp_size`` ranks: each stage's input rows are
taken rank by rank from the stage's own zigzag, all-gathered and restored
with the stage's restore index (``afd_split.pcp_rows``), exactly the layout
vLLM-Ascend's PCP helper gives that stage scheduled alone. The stage inputs the
helper sees (pieces, computed tokens advanced by the head) are cross-checked
against the split metadata the attention really uses.
"""

from __future__ import annotations

import numpy as np

from afd_split import SplitInvariantError
from afd_split.constraints import MIN_PCP_FOR_ZIGZAG
from afd_split.pcp_rows import gathered_stage_rows
from afd_split.pcp_stage import StageRows, stage_rows, stage_tokens


def pcp_rows_for(plan, metadata) -> StageRows | None:
    """The plan's per-stage PCP rows (None when the plan has no PCP)."""
    if plan.constraints.pcp_size < MIN_PCP_FOR_ZIGZAG:
        return None
    return stage_rows(plan, metadata.num_computed_tokens, plan.constraints.pcp_size)


def check_stage_inputs(plan, metadata, parts) -> None:
    """The helper's stage inputs equal the split metadata's own (per ubatch)."""
    for stage, part in zip(stage_tokens(plan, metadata.num_computed_tokens), parts, strict=True):
        scheduled = np.diff(part.query_start_loc)
        if (scheduled.tolist() != stage.num_scheduled_tokens.tolist()
                or part.num_computed_tokens.tolist() != stage.num_computed_tokens.tolist()):
            raise SplitInvariantError(
                f"ubatch {stage.index}: PCP stage inputs (scheduled "
                f"{stage.num_scheduled_tokens.tolist()}, computed "
                f"{stage.num_computed_tokens.tolist()}) differ from its split metadata "
                f"(scheduled {scheduled.tolist()}, computed {part.num_computed_tokens.tolist()})")


def stage_input_rows(rows: StageRows, plan, index: int, parent_rows, pad_value):
    """Stage ``index``'s input rows through the emulated ranks' all-gather and restore.

    The restored rows' real tokens (the stage's unpad mask) go to the plan's real
    rows of the ubatch; a leading one-token piece, which the helper copies on
    every rank as a decode, keeps its first copy as the real one.
    """
    import torch

    gathered = gathered_stage_rows(rows, index, parent_rows, pad_value)
    real = gathered[torch.from_numpy(rows.stages[index].unpad_mask)]
    ubatch = plan.ubatches[index]
    out = parent_rows.new_full((ubatch.num_rows, *parent_rows.shape[1:]), pad_value)
    out[torch.from_numpy(np.array(ubatch.real_row_indices, dtype=np.int64))] = real
    return out
