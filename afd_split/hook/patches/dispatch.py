"""The fourth patch: routed top-k ids counted where the Attention side dispatches them.

Written to the AFD plugin's AGENTS.md rules like every patch file: the pinned header
exactly (``pinned.DISPATCH``), the reason and behaviour in the comment above,
the AFD-split-only delta between ``# ### PATCH START/END``, and the whole
upstream body run through the ORIGINAL function object (this project does not
copy upstream code). Without a recorder on the connector (evidence off, or a
runner without the token_balanced hook session) the patch only delegates.

Removal plan (docs/ascend.md): upstream a per-dispatch observer hook (or
per-layer expert counts) to afd-plugin's connector; then this seam is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from afd_split.hook.facts.drift_guard import PATCH_MARKER, installed_branch
from afd_split.hook.facts.pinned import CONNECTOR_CLASS, DISPATCH, DISPATCH_NAME
from afd_split.hook.glue.runner import EXPERT_LOAD_ATTRIBUTE

if TYPE_CHECKING:  # names of the pinned header; never imported at run time
    from afd_plugin.connectors.base import AFDTransferContext
    from torch import Tensor


def make_dispatch_patch(original: Callable) -> Callable:
    # Upstream source: afd-plugin main 2e4378f / release/v0.19.1rc1 2f4f462,
    # connectors/npu/async_cam.py CAMAsyncAFDConnector.send_attn_output.
    # Patch reason: each stage's routed top-k ids exist on the Attention side with
    # their layer and stage only here, right before the CAM dispatch; the RFC's
    # per-expert and per-rank load evidence needs them.
    # Patch functionality: after the original dispatch is issued, the recorder the
    # hook session attached to this connector counts the ids on the device (no
    # host read; one host copy per step at the step's last dispatch).
    # Delegation exception: the whole upstream body runs through the original first.
    # Signature: matches upstream; no added parameters.
    def send_attn_output(self, hidden_states: Tensor, context: AFDTransferContext, **kwargs: Any) -> None:
        result = original(self, hidden_states, context, **kwargs)
        # ### PATCH START: afd_split expert-load counts
        recorder = vars(self).get(EXPERT_LOAD_ATTRIBUTE)
        if recorder is not None:
            metadata = context.metadata
            recorder.dispatched(metadata.layer_idx, metadata.stage_idx, kwargs["topk_ids"],
                                num_experts=self.num_routed_experts,
                                expert_per_rank=self.expert_per_rank)
        # ### PATCH END: afd_split expert-load counts
        return result

    setattr(send_attn_output, PATCH_MARKER, DISPATCH)
    return send_attn_output


def install_dispatch(connector_module: ModuleType) -> bool:
    """Patch the connector's dispatch seam (drift-checked, idempotent); True when now."""
    connector_class = vars(connector_module)[CONNECTOR_CLASS]
    dispatch = vars(connector_class)[DISPATCH_NAME]
    if getattr(dispatch, PATCH_MARKER, None) == DISPATCH:
        return False
    installed_branch(DISPATCH, dispatch)
    setattr(connector_class, DISPATCH_NAME, make_dispatch_patch(dispatch))
    return True
