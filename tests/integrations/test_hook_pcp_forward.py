"""The forward patch: relaid PCP stages through upstream's pipeline, on every rank at once.

The pipeline stand-in (``hook_standins.standin_forward_source``) does what
``run_async_moe_ubatch_afd_forward`` does at afd-plugin 2e4378f / 2f4f462. Its
layers are row-wise functions of (position, hidden, residual), so the split
forward must give every real token's rows exactly as the unsplit forward does on
the parent's rows: a row on the wrong rank, a wrong position or a wrong restore
shows up as a different value.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from afd_split import SplitConstraints, plan_split
from afd_split.hook.facts.drift_guard import PATCH_MARKER, PluginDriftError
from afd_split.hook.facts.forward_drift import forward_drift_in
from afd_split.hook.glue.pcp_seam import PcpStages
from afd_split.hook.install import ensure_forward_patched
from afd_split.hook.patches.forward import LayerRange, install_forward
from afd_split.hook.planning.stages import PlannedUBatchSlices
from tests.support.hook_standins import StandInUBatchSlice
from tests.support.pcp_helper_reference import helper_layout
from tests.support.pcp_runner_model import rank_positions
from tests.support.thread_group import ThreadGroup

RELEASE = "release/v0.19.1rc1"
FIRST_MOE_LAYER = 2
NUM_LAYERS = 5
WIDTH = 3


class RowLayer:
    """A decoder layer that works row by row (no attention): what relaid rows must preserve."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __call__(self, positions, hidden_states, residual):
        out = hidden_states * (1 + 0.125 * self.index) + positions.to(hidden_states.dtype)[:, None]
        return out, hidden_states if residual is None else residual + hidden_states


def _model(start=0, end=NUM_LAYERS):
    return SimpleNamespace(config=SimpleNamespace(first_k_dense_replace=FIRST_MOE_LAYER),
                           start_layer=start, end_layer=end,
                           layers=[RowLayer(i) for i in range(NUM_LAYERS)])


def _parent_rows(scheduled, computed, pcp, rank, padding_rows=0):
    sources = np.array(helper_layout(list(scheduled), pcp)["sources"][rank])
    value = torch.from_numpy(np.where(sources >= 0, sources + 1, 0)).float()
    hidden = value[:, None].repeat(1, WIDTH)
    positions = torch.from_numpy(rank_positions(list(scheduled), list(computed), pcp, rank)[1])
    if padding_rows:
        hidden = torch.cat([hidden, torch.full((padding_rows, WIDTH), -5.0)])
        positions = torch.cat([positions, torch.zeros(padding_rows, dtype=torch.int64)])
    return hidden, hidden * 0.5, positions, sources


def _planned(plan, computed, rank, all_to_all) -> PlannedUBatchSlices:
    """What the planner patch hands the pipeline for ``rank``: the relaid slices and the step."""
    pcp_stages = PcpStages.for_rank(plan, computed, rank, all_to_all, None, chunked_prefill=False)
    return PlannedUBatchSlices(pcp_stages.ubatch_slices(StandInUBatchSlice), plan=plan,
                               block_size=16, session=None, pcp=pcp_stages)


def _unsplit(original, hidden, residual, positions):
    whole = [StandInUBatchSlice(slice(0, 1), slice(0, hidden.shape[0]))]
    return original(_model(), hidden, residual, positions, None, {"ubatch_slices": whole}, None)


CASES = [([96, 40, 120, 64], [0, 32, 200, 16], 4), ([700], [128], 8),
         ([2, 3, 1, 1, 1], [0, 5, 2, 0, 4], 2), ([1, 1, 90, 33], [40, 7, 0, 5], 2)]


@pytest.mark.parametrize(("scheduled", "computed", "pcp"), CASES)
@pytest.mark.parametrize("padding_rows", [0, 3])
def test_relaid_stages_give_every_token_the_unsplit_rows(standin_plugin, scheduled, computed,
                                                         pcp, padding_rows):
    seams = standin_plugin(RELEASE)
    original = seams.forward_module.run_async_moe_ubatch_afd_forward
    assert install_forward(seams.forward_module)
    patched = seams.forward_module.run_async_moe_ubatch_afd_forward
    plan = plan_split(scheduled, policy="token_balanced",
                      constraints=SplitConstraints(pcp_size=pcp, align=2 * pcp),
                      num_computed_tokens=computed)
    assert plan.boundary_request is not None
    group = ThreadGroup(pcp)

    def rank_main(rank):
        slices = _planned(plan, computed, rank, group.all_to_all_for(rank))
        hidden, residual, positions, sources = _parent_rows(scheduled, computed, pcp, rank,
                                                            padding_rows)
        split = patched(_model(), hidden, residual, positions, None,
                        {"ubatch_slices": slices, "attn_metadata": None})
        return split, _unsplit(original, hidden, residual, positions), sources

    for split, unsplit, sources in group.run(rank_main):
        real = torch.from_numpy(np.flatnonzero(sources >= 0))
        for got, want in zip(split, unsplit, strict=True):
            assert got.shape == want.shape  # padding rows kept
            assert torch.equal(got[real], want[real])
        if padding_rows:  # the engine's padding rows come back as the dense layers left them
            assert torch.equal(split[0][-padding_rows:],
                               _model().layers[1](*_dense_pad(padding_rows))[0])


def test_a_rank_of_moe_layers_only_without_residual_keeps_every_row(standin_plugin):
    """A pipeline rank whose layers are all MoE gets no residual; the engine's padding rows
    come back as zeros in the residual the stages made."""
    seams = standin_plugin(RELEASE)
    original = seams.forward_module.run_async_moe_ubatch_afd_forward
    install_forward(seams.forward_module)
    patched = seams.forward_module.run_async_moe_ubatch_afd_forward
    scheduled, computed, pcp = [700], [128], 2
    plan = plan_split(scheduled, policy="token_balanced",
                      constraints=SplitConstraints(pcp_size=pcp, align=2 * pcp),
                      num_computed_tokens=computed)
    group = ThreadGroup(pcp)

    def rank_main(rank):
        slices = _planned(plan, computed, rank, group.all_to_all_for(rank))
        hidden, _, positions, sources = _parent_rows(scheduled, computed, pcp, rank, 2)
        moe_only = _model(start=FIRST_MOE_LAYER)
        split = patched(moe_only, hidden, None, positions, None, {"ubatch_slices": slices})
        whole = [StandInUBatchSlice(slice(0, 1), slice(0, hidden.shape[0]))]
        unsplit = original(moe_only, hidden, None, positions, None, {"ubatch_slices": whole},
                           None)
        return split, unsplit, sources

    for split, unsplit, sources in group.run(rank_main):
        real = torch.from_numpy(np.flatnonzero(sources >= 0))
        assert split[1].shape == split[0].shape == unsplit[0].shape
        assert torch.equal(split[0][real], unsplit[0][real])
        assert torch.equal(split[1][real], unsplit[1][real])
        assert not split[1][-2:].any()  # padding rows: zeros, no residual came in


def _dense_pad(rows):
    hidden = torch.full((rows, WIDTH), -5.0)
    layer0 = _model().layers[0]
    zeros = torch.zeros(rows, dtype=torch.int64)
    hidden, residual = layer0(zeros, hidden, hidden * 0.5)
    return zeros, hidden, residual


def test_upstream_slicing_would_give_a_relaid_stage_other_tokens():
    """Why the patch is required before any relaid stage runs: upstream slices the parent's
    rows by the stage's token slice, which under a cut holds other tokens than the stage's
    own zigzag (the rows its PCP metadata describes)."""
    plan = plan_split([700], policy="token_balanced",
                      constraints=SplitConstraints(pcp_size=2, align=4), num_computed_tokens=[0])
    for rank in range(2):
        pcp_stages = PcpStages.for_rank(plan, [0], rank, None, None, chunked_prefill=False)
        _, _, parent_positions, _ = _parent_rows([700], [0], 2, rank)
        relaid = pcp_stages.relayout.stage_positions
        sliced = [parent_positions[rows].numpy() for rows in pcp_stages.relayout.stage_row_slices]
        staged = [relaid[rows] for rows in pcp_stages.relayout.stage_row_slices]
        assert any(len(a) != len(b) or not np.array_equal(a, b)
                   for a, b in zip(sliced, staged, strict=True))


def test_other_slices_run_the_original_unchanged(standin_plugin):
    seams = standin_plugin(RELEASE)
    original = seams.forward_module.run_async_moe_ubatch_afd_forward
    install_forward(seams.forward_module)
    hidden, residual, positions, _ = _parent_rows([96, 40], [0, 8], 2, 0)
    slices = [StandInUBatchSlice(slice(0, 1), slice(0, 48)),
              StandInUBatchSlice(slice(1, 2), slice(48, 68))]
    got = seams.forward_module.run_async_moe_ubatch_afd_forward(
        _model(), hidden, residual, positions, None, {"ubatch_slices": slices})
    want = original(_model(), hidden, residual, positions, None, {"ubatch_slices": slices}, None)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_install_is_idempotent_and_ensure_patches_an_unpatched_module(standin_plugin):
    seams = standin_plugin(RELEASE)
    ensure_forward_patched()
    patched = seams.forward_module.run_async_moe_ubatch_afd_forward
    assert getattr(patched, PATCH_MARKER) == "forward"
    assert not install_forward(seams.forward_module)
    ensure_forward_patched()
    assert seams.forward_module.run_async_moe_ubatch_afd_forward is patched


def test_the_pipeline_body_is_drift_checked(standin_plugin):
    seams = standin_plugin(RELEASE)
    source = inspect.getsource(seams.forward_module.run_async_moe_ubatch_afd_forward)
    assert forward_drift_in(source) is None
    reads_more = source.replace("return torch.cat(hidden), torch.cat(rest)",
                                "return model.norm(torch.cat(hidden)), torch.cat(rest)")
    assert "reads ['norm'] of the model" in forward_drift_in(reads_more)
    no_dense = source.replace("first_moe_layer = int(model.config.first_k_dense_replace)",
                              "first_moe_layer = 0")
    assert "first_k_dense_replace" in forward_drift_in(no_dense)
    by_rows = source.replace("ubatch_slice.token_slice", "ubatch_slice.rows")
    assert "token_slice" in forward_drift_in(by_rows)


def test_a_drifted_pipeline_refuses_relaid_stages(standin_plugin):
    seams = standin_plugin(RELEASE)
    module = seams.forward_module
    original = module.run_async_moe_ubatch_afd_forward

    def run_async_moe_ubatch_afd_forward(model, hidden_states, residual, positions,
                                         afd_metadata, async_moe_ubatch_metadata,
                                         llama_4_scaling=None):  # a new body, same role
        return original(model, hidden_states, residual, positions, afd_metadata,
                        async_moe_ubatch_metadata, llama_4_scaling)

    module.run_async_moe_ubatch_afd_forward = run_async_moe_ubatch_afd_forward
    with pytest.raises(PluginDriftError):
        ensure_forward_patched()


def test_layer_range_reads_only_what_upstream_reads():
    model = _model()
    view = LayerRange(model, 2, 4)
    assert (view.start_layer, view.end_layer, view.layers, view.config) == (
        2, 4, model.layers, model.config)
    with pytest.raises(AttributeError):
        view.norm  # noqa: B018 - anything else fails loudly
