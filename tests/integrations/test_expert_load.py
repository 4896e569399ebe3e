"""Expert-load counts: counted on the device, one host copy per step, one line per step.

The expected counts are an independent numpy bincount of the ids the test
dispatched; the dispatch seam runs on a stand-in connector module carrying the
pinned header (hook_standins.standin_connector_source).
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from afd_split.hook.facts.drift_guard import PluginDriftError
from afd_split.hook.facts.pinned import DISPATCH, function_header, variant_for_branch
from afd_split.hook.glue.runner import attach_recorder
from afd_split.hook.patches.dispatch import install_dispatch, make_dispatch_patch
from afd_split.hook.planning.engine_step import StepRanks
from afd_split.hook.planning.expert_load import (
    EXPERT_LOAD_KIND,
    FLUSHED_AT_LAST_DISPATCH,
    FLUSHED_AT_NEXT_STEP,
    FORCED_BALANCED,
    NATURAL,
    ExpertLoadRecorder,
    routing_label,
)
from tests.support.hook_standins import _load, standin_connector_source

NUM_LAYERS, NUM_EXPERTS, TOP_K, EXPERT_PER_RANK = 4, 16, 3, 4
RANKS = StepRanks(global_rank=0).to_dict()


def recorder(lines, num_layers=NUM_LAYERS):
    return ExpertLoadRecorder(num_layers=num_layers, routing=NATURAL, ranks=RANKS,
                              write=lines.append)


def routed_ids(seed, tokens):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, NUM_EXPERTS, (tokens, TOP_K), generator=generator, dtype=torch.int32)


def dispatch_step(rec, stage_tokens, *, layers=range(NUM_LAYERS), seed=0):
    """Dispatch every layer of every stage in the plugin's order; the expected counts."""
    expected = np.zeros((len(stage_tokens), NUM_LAYERS, NUM_EXPERTS), np.int64)
    for layer in layers:
        for stage, tokens in enumerate(stage_tokens):
            ids = routed_ids(seed + 100 * layer + stage, tokens)
            expected[stage, layer] = np.bincount(ids.numpy().ravel(), minlength=NUM_EXPERTS)
            rec.dispatched(layer, stage, ids, num_experts=NUM_EXPERTS,
                           expert_per_rank=EXPERT_PER_RANK)
    return expected


def test_a_split_step_writes_one_line_at_its_last_dispatch():
    lines = []
    rec = recorder(lines)
    rec.begin_step(7, 2)
    expected = dispatch_step(rec, [13, 9])
    assert len(lines) == 1
    line = lines[0]
    assert line["kind"] == EXPERT_LOAD_KIND and line["step"] == 7
    assert line["flushed_at"] == FLUSHED_AT_LAST_DISPATCH
    assert line["layers"] == list(range(NUM_LAYERS)) and line["expert_per_rank"] == EXPERT_PER_RANK
    assert np.array_equal(np.asarray(line["per_stage"]), expected)
    assert [sum(map(sum, stage)) for stage in line["per_stage"]] == [
        NUM_LAYERS * 13 * TOP_K, NUM_LAYERS * 9 * TOP_K]
    json.dumps(line, allow_nan=False)  # a valid evidence line


def test_steps_do_not_leak_into_each_other():
    lines = []
    rec = recorder(lines)
    rec.begin_step(0, 2)
    dispatch_step(rec, [5, 5], seed=1)
    rec.begin_step(1, 1)
    expected = dispatch_step(rec, [4], seed=2)
    assert [line["step"] for line in lines] == [0, 1]
    assert np.array_equal(np.asarray(lines[1]["per_stage"]), expected)


def test_a_step_without_its_last_dispatch_is_flushed_when_the_next_is_planned():
    """A rank whose last layer is not its model's last (the trigger never comes): the
    counts still reach the line of their own step, at the next planning."""
    lines = []
    rec = recorder(lines)
    rec.begin_step(3, 1)
    expected = dispatch_step(rec, [6], layers=range(NUM_LAYERS - 1))
    assert lines == []
    rec.begin_step(4, 1)
    assert lines[0]["step"] == 3 and lines[0]["flushed_at"] == FLUSHED_AT_NEXT_STEP
    assert lines[0]["layers"] == list(range(NUM_LAYERS - 1))
    assert np.array_equal(np.asarray(lines[0]["per_stage"]), expected[:, : NUM_LAYERS - 1])


def test_unplanned_dispatches_are_not_counted_but_reported():
    lines = []
    rec = recorder(lines)
    rec.dispatched(0, 0, routed_ids(0, 4), num_experts=NUM_EXPERTS, expert_per_rank=4)
    rec.begin_step(0, 1)
    dispatch_step(rec, [2])
    assert lines[0]["unplanned_dispatches"] == 1
    assert sum(map(sum, lines[0]["per_stage"][0])) == NUM_LAYERS * 2 * TOP_K


def test_a_dispatch_outside_the_planned_stages_is_reported_not_counted():
    """Evidence never fails the forward: a stage or layer the plan does not have is
    counted as unplanned in the step's line."""
    lines = []
    rec = recorder(lines)
    rec.begin_step(0, 1)
    rec.dispatched(0, 1, routed_ids(0, 2), num_experts=NUM_EXPERTS, expert_per_rank=4)
    rec.dispatched(NUM_LAYERS, 0, routed_ids(0, 2), num_experts=NUM_EXPERTS, expert_per_rank=4)
    dispatch_step(rec, [3])
    assert lines[0]["unplanned_dispatches"] == 2
    assert sum(map(sum, lines[0]["per_stage"][0])) == NUM_LAYERS * 3 * TOP_K


class CopyCounter(TorchDispatchMode):
    """Counts the ops that produce a host copy (``_to_copy`` / ``copy_``) or read a scalar."""

    def __init__(self):
        super().__init__()
        self.host_copies = 0
        self.scalar_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default:
            self.host_copies += 1
        if func is torch.ops.aten._local_scalar_dense.default:
            self.scalar_reads += 1
        return func(*args, **kwargs)


def _device_guard():
    """The meta-device guard (``tests.support.device_guard``)."""
    from tests.support.device_guard import DeviceSyncGuard

    return DeviceSyncGuard


def test_counting_makes_no_host_read_and_the_step_one_copy():
    DeviceSyncGuard = _device_guard()
    rec = recorder([])
    rec.begin_step(0, 2)
    ids = torch.zeros((5, TOP_K), dtype=torch.int32, device="meta")
    guard = DeviceSyncGuard()  # meta tensors stand for the device: any host read fails
    with guard:
        rec.dispatched(0, 0, ids, num_experts=NUM_EXPERTS, expert_per_rank=4)
        rec.dispatched(0, 1, ids, num_experts=NUM_EXPERTS, expert_per_rank=4)
    assert "aten.index_add_.default" in guard.device_ops()
    lines = []
    rec = recorder(lines)
    rec.begin_step(0, 2)
    counter = CopyCounter()
    with counter:
        dispatch_step(rec, [7, 3])
    assert len(lines) == 1 and counter.host_copies == 1 and counter.scalar_reads == 0


def test_routing_label_follows_the_switch_of_the_dispatched_path():
    """Gate on Attention (the async-MoE path the seam counts): only the Attention gate's
    AFD_FORCE_BALANCED_TOPK_IDS rewrites the ids; enable_force_load_balance acts in the W8A8
    FusedMoE expert selection, which that path does not run (afd-plugin 2e4378f/2f4f462)."""
    assert routing_label(force_balanced_env=False, force_load_balance_config=False) == NATURAL
    assert routing_label(force_balanced_env=True, force_load_balance_config=False) == FORCED_BALANCED
    assert routing_label(force_balanced_env=False, force_load_balance_config=True) == NATURAL
    assert routing_label(force_balanced_env=True, force_load_balance_config=True) == FORCED_BALANCED
    assert routing_label(force_balanced_env=False, force_load_balance_config=True,
                         gate_on_attention=False) == FORCED_BALANCED
    assert routing_label(force_balanced_env=True, force_load_balance_config=False,
                         gate_on_attention=False) == NATURAL


@pytest.fixture
def connector_module(tmp_path):
    def build(branch="main", header_overrides=None):
        tmp_path.joinpath(branch.replace("/", "_")).mkdir()
        path = tmp_path / branch.replace("/", "_") / "async_cam.py"
        module = _load(path, standin_connector_source(branch, header_overrides))
        built.append(module.__name__)
        return module

    built = []
    yield build
    for name in built:
        sys.modules.pop(name, None)


class Context:
    def __init__(self, layer_idx, stage_idx, total_tokens):
        self.metadata = type("Meta", (), {"layer_idx": layer_idx, "stage_idx": stage_idx,
                                          "total_tokens": total_tokens})()


@pytest.mark.parametrize("branch", ["main", "release/v0.19.1rc1"])
def test_the_dispatch_seam_counts_after_the_plugin_dispatch(connector_module, branch):
    module = connector_module(branch)
    assert install_dispatch(module) is True and install_dispatch(module) is False
    patched = vars(module.CAMAsyncAFDConnector)["send_attn_output"]
    assert function_header(patched) == variant_for_branch(DISPATCH, branch).normalized_header
    connector = module.CAMAsyncAFDConnector(topk=TOP_K, num_routed_experts=NUM_EXPERTS,
                                            expert_per_rank=EXPERT_PER_RANK)
    lines = []
    rec = recorder(lines, num_layers=2)
    attach_recorder(connector, rec)
    rec.begin_step(0, 1)
    expected = []
    for layer in range(2):
        ids = routed_ids(layer, 6)
        expected.append(np.bincount(ids.numpy().ravel(), minlength=NUM_EXPERTS).tolist())
        connector.send_attn_output(torch.zeros(6, 8), Context(layer, 0, 6), topk_ids=ids,
                                   topk_weights=torch.ones(6, TOP_K))
    assert module.CALLS == [("dispatch", 0, 0), ("dispatch", 1, 0)]  # the plugin's own body
    assert lines[0]["per_stage"] == [expected]


def test_the_dispatch_seam_without_a_recorder_only_delegates(connector_module):
    module = connector_module()
    install_dispatch(module)
    connector = module.CAMAsyncAFDConnector(topk=TOP_K, num_routed_experts=NUM_EXPERTS,
                                            expert_per_rank=EXPERT_PER_RANK)
    connector.send_attn_output(torch.zeros(2, 8), Context(0, 0, 2), topk_ids=routed_ids(0, 2),
                               topk_weights=torch.ones(2, TOP_K))
    with pytest.raises(ValueError, match="topk_ids shape"):  # the plugin's check still runs
        connector.send_attn_output(torch.zeros(2, 8), Context(0, 0, 2), topk_ids=None)
    assert module.CALLS == [("dispatch", 0, 0)]


def test_a_drifted_dispatch_seam_fails_closed_naming_it(connector_module):
    drifted = variant_for_branch(DISPATCH, "main").header.replace(
        "**kwargs: Any", "layer_idx: int, **kwargs: Any")
    module = connector_module(header_overrides={DISPATCH: drifted})
    original = vars(module.CAMAsyncAFDConnector)["send_attn_output"]
    with pytest.raises(PluginDriftError, match="send_attn_output"):
        install_dispatch(module)
    assert vars(module.CAMAsyncAFDConnector)["send_attn_output"] is original
    assert make_dispatch_patch(original).__name__ == "send_attn_output"
