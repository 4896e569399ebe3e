"""The fifth patch: PCP stages run on their own zigzag rows (``afd_split.pcp.relayout``).

Written to the AFD plugin's AGENTS.md rules like every patch file: the pinned header
exactly (``pinned.FORWARD``), the reason and behaviour in the comment above,
the AFD-split-only delta between ``# ### PATCH START/END``, and every line of
upstream's pipeline run through the ORIGINAL function object (this project does
not copy upstream code): once over the dense layers alone, once over the MoE
layers alone on the relaid rows, each through a view of the model that narrows
its layer range. Anything but a token_balanced PCP step delegates unchanged.

Facts the delta relies on (afd-plugin main 2e4378f and release/v0.19.1rc1
2f4f462, ``model_executor/models/npu/deepseek_v2_async_cam_forward.py``; checked
by ``facts.forward_drift``): the function reads only ``model.config``,
``model.start_layer``, ``model.end_layer`` and ``model.layers``; it runs the
layers before ``config.first_k_dense_replace`` on the whole batch and returns
their output when no MoE layer follows (``dense_end_layer == model.end_layer``);
then it slices each stage's rows by ``UBatchSlice.token_slice`` and returns the
stages' outputs concatenated in stage order.

Removal plan (docs/ascend.md): once the runner lays a split's pieces out before
``_prepare_inputs`` (an upstream planner hook), the stages are contiguous rows
again and this seam is dropped.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from afd_split.errors import UnsupportedSplitError
from afd_split.hook.facts.drift_guard import PATCH_MARKER, PluginDriftError, installed_branch
from afd_split.hook.facts.forward_drift import forward_drift
from afd_split.hook.facts.pinned import FORWARD, FORWARD_NAME
from afd_split.hook.planning.stages import PlannedUBatchSlices
from afd_split.pcp.relayout import relay_rows, restore_rows

if TYPE_CHECKING:  # names of the pinned header; never imported at run time
    import torch
    from afd_plugin.model_executor.models import AsyncMoeUbatchMetadata
    from afd_plugin.model_executor.models.deepseek_v2 import (
        AFDDeepseekV2Model,
        AFDForwardContextMetadata,
    )

SLICES_KEY = "ubatch_slices"


@dataclass(frozen=True)
class LayerRange:
    """The model as upstream's pipeline reads it, narrowed to layers [start_layer, end_layer)."""

    model: Any
    start_layer: int
    end_layer: int

    @property
    def config(self):
        return self.model.config

    @property
    def layers(self):
        return self.model.layers


def run_relaid(original: Callable, model, hidden_states, residual, positions, afd_metadata,
               async_moe_ubatch_metadata, slices: PlannedUBatchSlices):
    """One token_balanced PCP step: dense layers on the parent's rows, the stages on their
    own zigzag rows, the outputs back on the parent's rows (shape and padding rows kept)."""
    pcp = slices.pcp
    first_moe = int(model.config.first_k_dense_replace)
    dense_end = min(model.end_layer, first_moe)
    if dense_end == model.end_layer:  # no MoE layer on this rank: nothing is staged
        return original(model, hidden_states, residual, positions, afd_metadata,
                        async_moe_ubatch_metadata, None)
    if dense_end > model.start_layer:
        hidden_states, residual = original(LayerRange(model, model.start_layer, dense_end),
                                           hidden_states, residual, positions, afd_metadata,
                                           async_moe_ubatch_metadata, None)
    rows = pcp.relayout.parent_rows
    if hidden_states.shape[0] < rows:
        raise UnsupportedSplitError(
            f"{hidden_states.shape[0]} hidden rows on PCP rank {pcp.relayout.pcp_rank}; the "
            f"planned layout has {rows}")
    move_in = functools.partial(relay_rows, pcp.relayout, all_to_all=pcp.all_to_all)
    relaid = _moved_pair(move_in, hidden_states[:rows],
                         None if residual is None else residual[:rows])
    staged = {**async_moe_ubatch_metadata, SLICES_KEY: list(slices)}
    outputs = original(LayerRange(model, max(model.start_layer, first_moe), model.end_layer),
                       relaid[0], relaid[1], pcp.positions_on(positions.device), afd_metadata,
                       staged, None)
    move_out = functools.partial(restore_rows, pcp.relayout, all_to_all=pcp.all_to_all)
    restored = _moved_pair(move_out, *outputs)
    total = hidden_states.shape[0]
    return (_with_padding_rows(restored[0], hidden_states, total, rows),
            _with_padding_rows(restored[1], residual, total, rows))


def _moved_pair(move: Callable, hidden_states, residual):
    """``move`` applied to hidden and residual rows: side by side in one all-to-all when they
    share a dtype (the model's activations), else one each."""
    if residual is None:
        return move(hidden_states), None
    if residual.dtype != hidden_states.dtype:
        return move(hidden_states), move(residual)
    import torch

    joined = move(torch.cat([hidden_states, residual], dim=-1))
    width = hidden_states.shape[-1]
    return joined[..., :width], joined[..., width:]


def _with_padding_rows(parent_rows, padding_source, total_rows: int, rows: int):
    """``parent_rows`` followed by the engine's padding rows past ``rows``: those of
    ``padding_source`` (the dense layers' output), zeros where it has none."""
    if parent_rows is None or total_rows == rows:
        return parent_rows
    import torch

    tail = (padding_source[rows:] if padding_source is not None
            else parent_rows.new_zeros((total_rows - rows, *parent_rows.shape[1:])))
    return torch.cat([parent_rows, tail])


def make_forward_patch(original: Callable) -> Callable:
    # Upstream source: afd-plugin main 2e4378f / release/v0.19.1rc1 2f4f462,
    # model_executor/models/npu/deepseek_v2_async_cam_forward.py run_async_moe_ubatch_afd_forward.
    # Patch reason: under PCP the runner lays out one zigzag per whole request before any
    # planner runs, so a stage cut inside a request is not a contiguous range of a rank's
    # rows, while its PCP metadata describes its own zigzag.
    # Patch functionality: for token_balanced PCP stages (PlannedUBatchSlices with a PCP
    # relayout) the original runs the dense layers alone, the rows move to each stage's
    # zigzag (one PCP all-to-all of the rows each rank lacks), the original runs
    # the MoE layers alone on them, and the outputs move back to the parent's rows.
    # Delegation exception: every other call runs the original unchanged.
    # Signature: matches upstream; no added parameters.
    def run_async_moe_ubatch_afd_forward(model: AFDDeepseekV2Model, hidden_states: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, afd_metadata: AFDForwardContextMetadata, async_moe_ubatch_metadata: AsyncMoeUbatchMetadata, llama_4_scaling: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        # ### PATCH START: afd_split relaid PCP stages
        slices = async_moe_ubatch_metadata[SLICES_KEY]
        if isinstance(slices, PlannedUBatchSlices) and slices.pcp is not None:
            if llama_4_scaling is not None:
                raise UnsupportedSplitError("llama_4_scaling rows are not relaid under PCP")
            return run_relaid(original, model, hidden_states, residual, positions,
                              afd_metadata, async_moe_ubatch_metadata, slices)
        # ### PATCH END: afd_split relaid PCP stages
        return original(model, hidden_states, residual, positions, afd_metadata,
                        async_moe_ubatch_metadata, llama_4_scaling)

    setattr(run_async_moe_ubatch_afd_forward, PATCH_MARKER, FORWARD)
    return run_async_moe_ubatch_afd_forward


def install_forward(forward_module: ModuleType) -> bool:
    """Patch the async-MoE pipeline (header and body drift-checked, idempotent); True when now."""
    forward = vars(forward_module)[FORWARD_NAME]
    if getattr(forward, PATCH_MARKER, None) == FORWARD:
        return False
    installed_branch(FORWARD, forward)
    drift = forward_drift(forward)
    if drift is not None:
        raise PluginDriftError(f"afd_plugin {FORWARD_NAME} drifted: {drift}; re-pin it "
                               "(AGENTS.md) before token_balanced can run under PCP",
                               seam=FORWARD)
    setattr(forward_module, FORWARD_NAME, make_forward_patch(forward))
    return True
