"""The slicer patch: ``PlannedUBatchSlices`` sliced by afd_split's adapter.

Written to the AFD plugin's AGENTS.md rules: the patch function carries the pinned
upstream header exactly (``facts.pinned``), has its reason and behaviour in the
comment right above it, and marks every AFD-split-only delta with
``# ### PATCH START/END``. Every value of ``async_moe_split`` other than
``token_balanced`` delegates to the ORIGINAL function object, so the plugin runs
byte-for-byte unchanged (this project reads upstream for facts and does not copy its
code). The factory closes over the original; nothing is stored in a module global.

Removal plan (docs/ascend.md): upstream an ``async_moe_split`` planner registry to
afd-plugin (plan function + metadata splitter per value); then this seam stops being
patched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from afd_split.hook.facts.drift_guard import PATCH_MARKER
from afd_split.hook.facts.pinned import SLICER
from afd_split.hook.planning.stages import PlannedUBatchSlices

if TYPE_CHECKING:  # names of the pinned header; never imported at run time
    from vllm.v1.worker.ubatch_utils import UBatchSlices
    from vllm_ascend.attention.utils import AscendCommonAttentionMetadata


def make_slicer_patch(original: Callable) -> Callable:
    # Upstream source: afd-plugin main 2e4378f / release/v0.19.1rc1 2f4f462,
    # v1/worker/npu/ubatch_utils.py split_attn_metadata, as bound in
    # attention_model_runner (the name _build_attention_metadata_with_ubatches calls).
    # Patch reason: the plugin's slicer copies whole-batch fields into each stage
    # and cannot cut inside a request; under PCP it slices the parent's rank rows,
    # while a relaid stage has rows of its own, and its stage-PCP rebuild reads the
    # whole batch's input_batch (stage 1 gets the first requests' cached lengths).
    # Patch functionality: PlannedUBatchSlices (made only by the token_balanced
    # planner) are sliced by afd_split's adapter, which request-level checks them;
    # under PCP each stage is built for its relaid rows and iterated with its
    # stage-local rebuild inputs (pcp_seam.PcpStages.split).
    # Delegation exception: any other UBatchSlices go to the original unchanged.
    # Signature: matches upstream; no added parameters.
    def split_attn_metadata(ubatch_slices: UBatchSlices, common_attn_metadata: AscendCommonAttentionMetadata, max_num_tokens: int = 0) -> list[AscendCommonAttentionMetadata]:
        # ### PATCH START: afd_split stage slicing
        if isinstance(ubatch_slices, PlannedUBatchSlices):
            return ubatch_slices.split(common_attn_metadata)
        # ### PATCH END: afd_split stage slicing
        return original(ubatch_slices, common_attn_metadata, max_num_tokens)

    setattr(split_attn_metadata, PATCH_MARKER, SLICER)
    return split_attn_metadata
