"""Expert load counts real rows only, through the pinned pipeline (issue 29, item 6).

The async-MoE pipeline stand-in (hook_standins.standin_forward_source: what
``run_async_moe_ubatch_afd_forward`` does at afd-plugin 2e4378f / 2f4f462) slices
each stage's rows with ``UBatchSlice.token_slice``; its MoE layers route every row
they get and dispatch the ids through the patched ``send_attn_output`` of the
connector stand-in, as the Attention side does. So padding rows reach the dispatch
with router ids: the SP parent's padding on the tail, and under PCP the stage
layouts' pad rows (and the decode copies every PCP rank holds). The expected counts
are an independent bincount of the routing rule over the real tokens of each stage
(global token indices, no afd_split code).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from afd_split.hook.glue.load_rows import pcp_stage_rows
from afd_split.hook.glue.pcp_seam import plan_pcp_step
from afd_split.hook.glue.runner import attach_recorder
from afd_split.hook.patches.dispatch import install_dispatch
from afd_split.hook.planning.engine_step import StepRanks
from afd_split.hook.planning.expert_load import NATURAL, ExpertLoadRecorder
from afd_split.hook.planning.stages import HookSession, plan_stages
from afd_split.pcp.alignment import EngineAlignment
from afd_split.pcp.relayout import rank_relayout
from afd_split.pcp.stage import PAD_TOKEN, stage_tokens, zigzag_layout
from tests.support.hook_standins import StandInUBatchSlice, _load, standin_connector_source

NUM_EXPERTS, TOP_K, EXPERT_PER_RANK = 256, 8, 32
NUM_DENSE, NUM_LAYERS = 1, 4  # one dense layer, three MoE layers (the example)
PAD_HIDDEN = -7.0  # what a padding row holds: not a token index


def route(hidden_values: np.ndarray, layer: int) -> np.ndarray:
    """The routing rule: top-k experts of a row from its value (a token index for real rows)."""
    base = np.asarray(hidden_values, dtype=np.int64)[:, None]
    return (base * 37 + layer * 101 + np.arange(TOP_K)[None, :] * 29) % NUM_EXPERTS


def expected_counts(stage_tokens_list) -> np.ndarray:
    """[stage][moe layer][expert] over each stage's real global token indices."""
    out = np.zeros((len(stage_tokens_list), NUM_LAYERS, NUM_EXPERTS), np.int64)
    for stage, tokens in enumerate(stage_tokens_list):
        for layer in range(NUM_DENSE, NUM_LAYERS):
            out[stage, layer] = np.bincount(route(tokens, layer).ravel(), minlength=NUM_EXPERTS)
    return out[:, NUM_DENSE:]


class MoeLayer:
    """Routes every row it gets and dispatches the ids (stage by call order, as the
    pipeline calls each layer once per stage)."""

    def __init__(self, index: int, connector, num_stages: int) -> None:
        self.index, self.connector, self.num_stages, self.calls = index, connector, num_stages, 0

    def __call__(self, positions, hidden, residual):
        stage = self.calls % self.num_stages
        self.calls += 1
        ids = torch.from_numpy(route(hidden[:, 0].numpy(), self.index)).to(torch.int32)
        context = SimpleNamespace(metadata=SimpleNamespace(
            layer_idx=self.index, stage_idx=stage, total_tokens=hidden.shape[0]))
        self.connector.send_attn_output(hidden, context, topk_ids=ids)
        return hidden, residual


def dense(positions, hidden, residual):
    return hidden, residual


@pytest.fixture
def connector(tmp_path):
    module = _load(tmp_path / "async_cam.py", standin_connector_source("main"))
    install_dispatch(module)
    return module.CAMAsyncAFDConnector(topk=TOP_K, num_routed_experts=NUM_EXPERTS,
                                       expert_per_rank=EXPERT_PER_RANK)


def run_pipeline(standin_plugin, connector, hidden_values, ubatch_slices) -> None:
    forward = standin_plugin("release/v0.19.1rc1").forward_module
    model = SimpleNamespace(
        config=SimpleNamespace(first_k_dense_replace=NUM_DENSE), start_layer=0,
        end_layer=NUM_LAYERS,
        layers=[dense] * NUM_DENSE + [MoeLayer(i, connector, len(ubatch_slices))
                                      for i in range(NUM_DENSE, NUM_LAYERS)])
    hidden = torch.tensor(hidden_values, dtype=torch.float64)[:, None]
    positions = torch.arange(len(hidden_values))
    forward.run_async_moe_ubatch_afd_forward(model, hidden, torch.zeros_like(hidden), positions, None,
                                             {"ubatch_slices": ubatch_slices})


def recorder(lines, rank=0):
    return ExpertLoadRecorder(num_layers=NUM_LAYERS, routing=NATURAL,
                              ranks=StepRanks(global_rank=rank, pcp_rank=rank).to_dict(),
                              write=lines.append)


SP_SCHEDULED = [512, 2995, 256, 700, 130]  # 4,593 tokens, padded to 4,600 under SP at TP 8


@pytest.mark.parametrize("counted_rows", ["real", "every"])
def test_sp_padding_rows_are_reported_apart_not_counted(standin_plugin, connector,
                                                        counted_rows):
    lines = []
    session = HookSession(ranks=StepRanks(global_rank=0), groups=[], splitter=None,
                          alignment=EngineAlignment(tp_size=8, sequence_parallel=True),
                          expert_load=recorder(lines))
    attach_recorder(connector, session.expert_load)
    real = sum(SP_SCHEDULED)
    padded = -(-real // 8) * 8
    assert (real, padded) == (4593, 4600)
    slices = plan_stages(session, np.asarray(SP_SCHEDULED), num_computed_tokens=np.zeros(5, int),
                         block_size=128, slice_type=StandInUBatchSlice, num_input_tokens=padded)
    plan = slices.plan
    if counted_rows == "every":  # the fault the issue found: every dispatched row counted
        session.expert_load.stage_rows = None
    hidden = np.concatenate([np.arange(real), np.full(padded - real, PAD_HIDDEN)])
    run_pipeline(standin_plugin, connector, hidden, list(slices))
    (line,) = lines
    tail = plan.ubatches[1]
    assert (tail.num_real_tokens, tail.num_rows) == (2297, 2304)
    got = np.asarray(line["per_stage"])
    want = expected_counts([np.arange(u.token_slice.start, u.token_slice.stop)
                            for u in plan.ubatches])
    moe_layers = NUM_LAYERS - NUM_DENSE
    if counted_rows == "every":
        assert int(got[1].sum()) == 2304 * TOP_K * moe_layers == 55_296
        assert not np.array_equal(got, want)  # the padding rows' experts are inflated
        return
    assert int(got[1].sum()) == 2297 * TOP_K * moe_layers == 55_128
    assert np.array_equal(got, want)
    assert line["real_rows_only"] is True
    assert line["padding_routed_rows"] == 7 * moe_layers
    assert line["replicated_routed_rows"] == 0


PCP_BATCHES = [
    ([1, 1, 700, 300, 1500, 400, 96], [128, 64, 128, 2048, 512, 0, 1664]),
    ([1000, 1000], [0, 256]),
    ([1, 1, 1, 1800, 1, 1, 400], [300, 40, 900, 0, 7, 12, 0]),
]


@pytest.mark.parametrize("pcp", [2, 8])
@pytest.mark.parametrize("batch", range(len(PCP_BATCHES)))
def test_pcp_ranks_count_each_real_token_once(standin_plugin, connector, pcp, batch):
    scheduled, computed = (np.asarray(x, dtype=np.int64) for x in PCP_BATCHES[batch])
    plan = plan_pcp_step(scheduled, computed, EngineAlignment(tp_size=1, sequence_parallel=False,
                                                              pcp_size=pcp))
    assert plan.is_split
    stages = stage_tokens(plan, computed)
    summed = 0
    padding = replicated = dispatched_rows = 0
    for rank in range(pcp):
        relayout = rank_relayout(plan, computed, rank)
        # This rank's relaid rows: each stage's own zigzag of its pieces (global token
        # indices; pad rows hold no token).
        hidden = []
        for stage in stages:
            sources = zigzag_layout(stage.num_scheduled_tokens, pcp).rank_sources[rank]
            hidden.append(np.where(sources == PAD_TOKEN, PAD_HIDDEN, sources + stage.token_start))
        hidden = np.concatenate(hidden)
        assert len(hidden) == relayout.stage_rows
        dispatched_rows += len(hidden)
        lines = []
        rec = recorder(lines, rank)
        attach_recorder(connector, rec)
        rec.begin_step(0, len(stages), pcp_stage_rows(plan, computed, relayout))
        slices = [StandInUBatchSlice(slice(0, 0), rows) for rows in relayout.stage_row_slices]
        run_pipeline(standin_plugin, connector, hidden, slices)
        (line,) = lines
        summed = summed + np.asarray(line["per_stage"])
        padding += line["padding_routed_rows"]
        replicated += line["replicated_routed_rows"]
    want = expected_counts([stage.token_start + np.arange(stage.num_tokens) for stage in stages])
    assert np.array_equal(summed, want)
    moe_layers = NUM_LAYERS - NUM_DENSE
    # Every dispatched row is a counted real token, a pad row or a decode copy.
    assert dispatched_rows * moe_layers == int(scheduled.sum()) * moe_layers + padding + replicated
    decodes = sum(int((s.num_scheduled_tokens[:1] == 1).all()) for s in stages)
    assert (replicated > 0) == (decodes > 0 and pcp > 1)
