"""Which dispatched rows of a PCP rank hold a real token, for the expert-load counts.

Under PCP each rank dispatches its own rows of a stage: the stage's own zigzag
layout of its pieces (``pcp_stage.zigzag_layout``, what ``pcp_relayout`` lays the
stage out as), where every request piece is padded to 2·pcp rows in all (pad
rows: ``PAD_TOKEN``; ``RankRelayout.stage_sources`` cannot tell them, since a
request copied whole brings its parent pad rows along) and every leading decode
is held on every rank (vLLM-Ascend's unpad mask keeps rank 0's copy). A
real token is counted once over the PCP group: on its one row, and a decode on
rank 0. Unsplit PCP steps dispatch the parent's own zigzag rows.
"""

from __future__ import annotations

import numpy as np

from afd_split.hook.planning.expert_load import StageRows
from afd_split.pcp.relayout import RankRelayout
from afd_split.pcp.stage import PAD_TOKEN, num_decode_requests, stage_tokens, zigzag_layout
from afd_split.plan.planner import SplitPlan

COUNTING_PCP_RANK = 0
"""The rank whose copy of a decode row is counted (the engine's unpad mask keeps it)."""


def _rows(held: np.ndarray, num_decode_rows: int, pcp_rank: int) -> StageRows:
    real = held.copy()
    replicated = 0
    if pcp_rank != COUNTING_PCP_RANK:
        replicated = int(held[:num_decode_rows].sum())
        real[:num_decode_rows] = False
    return StageRows(real, padding=int((~held).sum()), replicated=replicated)


def _decode_rows(num_scheduled_tokens: np.ndarray) -> int:
    """Rows every rank holds of the leading decodes (a decode's tokens, on each rank)."""
    return int(num_scheduled_tokens[:num_decode_requests(num_scheduled_tokens)].sum())


def pcp_stage_rows(plan: SplitPlan, num_computed_tokens, relayout: RankRelayout) -> tuple:
    """``StageRows`` of each relaid stage on ``relayout``'s rank."""
    computed = np.asarray(num_computed_tokens, dtype=np.int64)
    out = []
    for stage, rows in zip(stage_tokens(plan, computed), relayout.stage_row_slices, strict=True):
        layout = zigzag_layout(stage.num_scheduled_tokens, relayout.pcp_size)
        held = layout.rank_sources[relayout.pcp_rank] != PAD_TOKEN
        if len(held) != rows.stop - rows.start:
            raise ValueError(f"stage {stage.index}: its zigzag has {len(held)} rows on rank "
                             f"{relayout.pcp_rank}, the relayout {rows.stop - rows.start}")
        out.append(_rows(held, _decode_rows(stage.num_scheduled_tokens), relayout.pcp_rank))
    return tuple(out)


def pcp_parent_rows(plan: SplitPlan, pcp_rank: int) -> tuple:
    """``StageRows`` of an unsplit PCP step: the parent's zigzag rows on ``pcp_rank``."""
    counts = np.asarray(plan.token_counts, dtype=np.int64)
    layout = zigzag_layout(counts, plan.constraints.pcp_size)
    return (_rows(layout.rank_sources[pcp_rank] != PAD_TOKEN, _decode_rows(counts), pcp_rank),)
