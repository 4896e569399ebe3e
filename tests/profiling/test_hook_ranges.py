"""The hook's layer/stage profiler ranges on a stand-in of the AFD plugin's Attention model:
the trace carries them, and the analysis attributes work to layers and stages from them.

The stand-in follows afd-plugin main 2e4378f / release/v0.19.1rc1 2f4f462
(``model_executor/models/deepseek_v2.py``: ``AFDDeepseekV2DecoderLayer`` with
``layer_idx``, ``is_moe_layer``, ``self_attn``, ``mlp`` (dense MLP, or the MoE whose
``gate`` the Attention side calls), ``compute_attn_output``;
``npu/deepseek_v2_async_cam_forward.run_async_moe_ubatch_afd_forward``: dense layers
whole, then MoE layers per stage in the pipelined order stage 0 of layer i+1 after
stage 1 of layer i, each stage inside a forward context carrying ``ubatch_idx`` and
``num_ubatches``). Its modules are small torch layers with seeded weights.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("msprof_analyze")

from afd_split.hook.glue import layer_ranges  # noqa: E402
from afd_split.ranges import NO_INDEX, RangeTag, parse_range  # noqa: E402
from pytest_afd.profiling import kernels, torch_trace  # noqa: E402
from pytest_afd.profiling.timebase import us_to_ns  # noqa: E402

HIDDEN = 16
NUM_LAYERS = 4
FIRST_K_DENSE = 1
NUM_STAGES = 2
TOKENS = 6
ENABLED = {layer_ranges.ATTENTION_PROFILER_ENABLE: "true"}


class ForwardContext:
    """The stage fields the plugin sets on vLLM's forward context while a stage runs."""

    def __init__(self) -> None:
        self.ubatch_idx: int | None = None
        self.num_ubatches: int | None = None

    def ubatch(self) -> int:
        if self.ubatch_idx is not None and (self.num_ubatches or 0) > 1:
            return self.ubatch_idx
        return NO_INDEX


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.o_proj = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, hidden):
        return self.o_proj(torch.softmax(self.q_proj(hidden), dim=-1))


class DenseMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, hidden):
        return self.up(hidden)


class MoE(torch.nn.Module):
    """On the Attention role only the gate of the MoE is called."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(HIDDEN, 8)


class DecoderLayer(torch.nn.Module):
    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.is_moe_layer = layer_idx >= FIRST_K_DENSE
        self.self_attn = Attention()
        self.mlp = MoE() if self.is_moe_layer else DenseMLP()

    def forward(self, hidden):  # dense layers: called whole
        return self.mlp(self.self_attn(hidden))

    def compute_attn_output(self, hidden):  # MoE layers: per stage, with the gate
        hidden = self.self_attn(hidden)
        topk = torch.topk(self.mlp.gate(hidden), 2, dim=-1)
        return hidden, topk


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(DecoderLayer(i) for i in range(NUM_LAYERS))

    def forward(self, hidden, context: ForwardContext):
        for layer in self.layers[:FIRST_K_DENSE]:
            hidden = layer(hidden)
        stages = list(hidden.split(TOKENS // NUM_STAGES))
        moe = list(self.layers[FIRST_K_DENSE:])

        def stage(layer, index):
            context.ubatch_idx, context.num_ubatches = index, NUM_STAGES
            try:
                stages[index], _ = layer.compute_attn_output(stages[index])
            finally:
                context.ubatch_idx = context.num_ubatches = None

        stage(moe[0], 0)
        for current, following in itertools.pairwise(moe):
            stage(current, 1)
            stage(following, 0)
        stage(moe[-1], 1)
        return torch.cat(stages)


class Runner:
    def __init__(self, model) -> None:
        self.model = model

    def get_model(self):
        return self.model


def expected_ranges() -> set[RangeTag]:
    dense = {RangeTag(stage, layer) for layer in range(FIRST_K_DENSE)
             for stage in ("attention", "dense_mlp")}
    staged = {RangeTag(stage, layer, index) for layer in range(FIRST_K_DENSE, NUM_LAYERS)
              for index in range(NUM_STAGES) for stage in ("attention", "route")}
    return dense | staged


def _hook_count(model) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


@pytest.fixture
def profiled_trace(tmp_path: Path) -> Path:
    """One profiled forward of the stand-in with the hook's ranges, as a CPU trace root."""
    torch.manual_seed(0)
    model, context = Model(), ForwardContext()
    runner = Runner(model)
    layer_ranges.ensure_runner_ranges(runner, ENABLED, ubatch_of=context.ubatch)
    path = tmp_path / "attention" / "rank0" / "step0.pt.trace.json"
    path.parent.mkdir(parents=True)
    with torch.no_grad(), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        model(torch.randn(TOKENS, HIDDEN), context)
    profiler.export_chrome_trace(str(path))
    return path


def test_ranges_install_only_with_the_profiler_on_and_once() -> None:
    model = Model()
    runner = Runner(model)
    for environ in ({}, {layer_ranges.ATTENTION_PROFILER_ENABLE: "false"}):
        layer_ranges.ensure_runner_ranges(runner, environ, ubatch_of=lambda: NO_INDEX)
        assert _hook_count(model) == 0 and layer_ranges.RANGES_ATTRIBUTE not in vars(runner)
    layer_ranges.ensure_runner_ranges(runner, ENABLED, ubatch_of=lambda: NO_INDEX)
    installed = vars(runner)[layer_ranges.RANGES_ATTRIBUTE]
    hooks = _hook_count(model)
    assert hooks == 2 * len(installed.ranges) == 2 * (2 * NUM_LAYERS)
    layer_ranges.ensure_runner_ranges(runner, ENABLED, ubatch_of=lambda: NO_INDEX)
    assert _hook_count(model) == hooks  # once per runner
    installed.remove()
    assert _hook_count(model) == 0


def test_a_model_without_decoder_layers_is_recorded_never_raised() -> None:
    runner = Runner(torch.nn.Linear(2, 2))
    layer_ranges.ensure_runner_ranges(runner, ENABLED, ubatch_of=lambda: NO_INDEX)
    assert "no decoder layer" in vars(runner)[layer_ranges.RANGES_ATTRIBUTE]


def test_a_failing_stage_still_closes_its_range(tmp_path: Path) -> None:
    model, context = Model(), ForwardContext()
    layer_ranges.ensure_runner_ranges(Runner(model), ENABLED, ubatch_of=context.ubatch)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        with pytest.raises(RuntimeError):
            model.layers[0](torch.randn(3, HIDDEN + 1))  # wrong width: self_attn raises
        model.layers[0](torch.randn(3, HIDDEN))
    path = tmp_path / "trace.json"
    profiler.export_chrome_trace(str(path))
    names = [event["name"] for event in json.loads(path.read_text())["traceEvents"]
             if event.get("ph") == "X" and parse_range(str(event.get("name")))]
    assert Counter(names) == {"afd|attention|L0|U-": 2, "afd|dense_mlp|L0|U-": 1}


def test_the_trace_carries_one_range_per_stage_call(profiled_trace: Path) -> None:
    ranges, _ = kernels.read_ranges_and_flows(profiled_trace)
    assert Counter(r.tag for r in ranges) == dict.fromkeys(expected_ranges(), 1)


def test_the_analysis_attributes_work_to_layers_and_stages(profiled_trace: Path) -> None:
    profile = torch_trace.analyse(profiled_trace.parents[2])
    # per_layer names the range's stage "range" and its ubatch "stage" (the result schema).
    found = {(row["range"], row["layer"], row["stage"]): row["component"]
             for row in profile["per_layer"]}
    assert set(found) == {(t.stage, t.layer, t.ubatch) for t in expected_ranges()}
    assert found[("attention", 2, 1)] == "attention"
    assert found[("dense_mlp", 0, NO_INDEX)] == "dense_mlp"
    assert found[("route", 3, 0)] == "routed_moe"


def test_each_matmul_is_placed_in_the_range_of_the_module_that_ran_it(
        profiled_trace: Path) -> None:
    """The hardware path's placement (``kernels.innermost``) over the CPU trace's ops."""
    ranges, _ = kernels.read_ranges_and_flows(profiled_trace)
    starts = [r.start_ns for r in ranges]
    events = json.loads(profiled_trace.read_text())["traceEvents"]
    placed = Counter(
        kernels.innermost(ranges, starts, us_to_ns(event["ts"]))
        for event in events if event.get("ph") == "X" and event.get("name") == "aten::linear")
    linears = {"attention": 2, "dense_mlp": 1, "route": 1}  # Linear modules per stage call
    assert placed == {tag: linears[tag.stage] for tag in expected_ranges()}
