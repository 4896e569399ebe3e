"""Profiler ranges around each decoder layer's stages on the AFD plugin's Attention side.

A profile is attributed to layers and stages from ``afd_split.ranges`` ranges,
never from kernel order. On NPUs the plugin's own profiler
(``afd_plugin/compat/npu/profiler.py``, afd-plugin main 2e4378f and
release/v0.19.1rc1 2f4f462) records CPU and NPU activities with
``ProfilerLevel.Level2`` and Text export, and turns no mstx switch on
(``_ExperimentalConfig`` is given ``export_type``, ``profiler_level`` and
``aic_metrics`` only): ``torch.profiler.record_function`` ranges are what its
``trace_view.json`` keeps, so that is what is emitted here.

Where the ranges come from (read at afd-plugin 2e4378f / 2f4f462,
``model_executor/models/deepseek_v2.py`` and
``model_executor/models/npu/deepseek_v2_async_cam_forward.py``): the Attention
role's model is ``AFDDeepseekV2Model``; each decoder layer has an int
``layer_idx``, ``is_moe_layer``, and the modules ``self_attn`` and ``mlp``.
Dense layers are called whole (``layer(positions, ...)``: ``self_attn`` then
``mlp``, on the whole batch); MoE layers run ``layer.compute_attn_output`` per
ubatch stage inside ``_use_async_moe_ubatch_forward_context``, which sets the
forward context's ``ubatch_idx`` / ``num_ubatches``, and call ``self.self_attn``
and, with ``compute_gate_on_attention``, ``layer.mlp.gate`` (through
``npu/deepseek_v2_attention_gate.compute_gate_topk``). So module forward
pre/post hooks on those three modules give every stage of every layer a range,
``afd|attention|L<i>|U<s>``, ``afd|dense_mlp|L<i>|U-``, ``afd|route|L<i>|U<s>``,
without patching any upstream function. CAM dispatch/combine and the FFN side's
routed experts run outside modules; their kernels are classified by operator
type (``pytest_afd.profiling.components``).

Cost: nothing is registered unless the Attention profiler is switched on
(``AFD_NPU_ATTENTION_PROFILER_ENABLE``, read as the plugin reads it). The hooks
need the eager path (the harness's plans run ``--enforce-eager``): under a
compiled graph Dynamo traces module hooks and drops ``record_function``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from afd_split.ranges import NO_INDEX, range_name

logger = logging.getLogger(__name__)

ATTENTION_PROFILER_ENABLE = "AFD_NPU_ATTENTION_PROFILER_ENABLE"
"""The plugin's switch for the Attention role's profiler (afd-plugin compat/npu/profiler.py)."""

TRUE_VALUES = frozenset({"1", "true", "yes", "on"})
"""The plugin's ``_env_bool`` true spellings."""

RANGES_ATTRIBUTE = "_afd_split_layer_ranges"
"""AFD-only runner attribute: its ``LayerRanges``, or why none were installed."""

ATTENTION_STAGE = "attention"
DENSE_MLP_STAGE = "dense_mlp"
ROUTE_STAGE = "route"

UBatchOf = Callable[[], int]


def profiler_enabled(environ: Mapping[str, str]) -> bool:
    """Whether the plugin's Attention profiler is on (a bad value: off; the plugin raises)."""
    return environ.get(ATTENTION_PROFILER_ENABLE, "").strip().lower() in TRUE_VALUES


def decoder_layers(model) -> list:
    """The model's decoder layers: modules with an int ``layer_idx`` and a ``self_attn``."""
    return [module for module in model.modules()
            if isinstance(getattr(module, "layer_idx", None), int)
            and hasattr(module, "self_attn")]


def stage_modules(layer) -> list[tuple[Any, str]]:
    """(module, stage) pairs of one decoder layer, as the Attention role calls them."""
    pairs = [(layer.self_attn, ATTENTION_STAGE)]
    mlp = getattr(layer, "mlp", None)
    if mlp is None:
        return pairs
    if getattr(layer, "is_moe_layer", False):
        gate = getattr(mlp, "gate", None)
        if gate is not None:
            pairs.append((gate, ROUTE_STAGE))
    else:
        pairs.append((mlp, DENSE_MLP_STAGE))
    return pairs


@dataclass
class LayerRanges:
    """The hooks emitting one range per call of each stage module (removable)."""

    ubatch_of: UBatchOf
    handles: list = field(default_factory=list)
    ranges: list[tuple[str, int]] = field(default_factory=list)

    def attach(self, module, stage: str, layer: int) -> None:
        from torch.profiler import record_function

        open_ranges: list = []  # this module's open ranges (a module may be re-entered)

        def enter(_module, _args) -> None:
            scope = record_function(range_name(stage, layer, self.ubatch_of()))
            scope.__enter__()
            open_ranges.append(scope)

        def leave(_module, _args, _output) -> None:
            if open_ranges:
                open_ranges.pop().__exit__(None, None, None)

        self.handles.append(module.register_forward_pre_hook(enter))
        # always_call: an exception in the module still closes its range.
        self.handles.append(module.register_forward_hook(leave, always_call=True))
        self.ranges.append((stage, layer))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def install_layer_ranges(model, ubatch_of: UBatchOf) -> LayerRanges:
    """Range hooks on every decoder layer's stage modules of ``model``."""
    installed = LayerRanges(ubatch_of)
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no decoder layer (a module with an int "
                         "layer_idx and a self_attn)")
    for layer in layers:
        for module, stage in stage_modules(layer):
            installed.attach(module, stage, layer.layer_idx)
    return installed


def forward_context_ubatch() -> int:
    """The ubatch stage being run: vLLM's forward context ``ubatch_idx`` when the step is
    staged (``num_ubatches`` > 1, set by the plugin per stage), else -1 (whole batch)."""
    try:
        from vllm.forward_context import get_forward_context

        context = get_forward_context()
    except (ImportError, AssertionError):  # no vLLM, or no forward context: whole batch
        return NO_INDEX
    index = getattr(context, "ubatch_idx", None)
    stages = getattr(context, "num_ubatches", None)
    if isinstance(index, int) and isinstance(stages, int) and stages > 1:
        return index
    return NO_INDEX


def ensure_runner_ranges(runner, environ: Mapping[str, str] = os.environ,
                         ubatch_of: UBatchOf = forward_context_ubatch) -> None:
    """Install the ranges on ``runner``'s model once, when its profiler is on; never raises.

    Called after the runner's metadata router (``evidence_only``), which runs every
    step and in the profile run, after the model is loaded.
    """
    if RANGES_ATTRIBUTE in vars(runner) or not profiler_enabled(environ):
        return
    try:
        model = runner.get_model()
    except Exception:  # not loaded yet: tried again after the next step's router
        return
    try:
        vars(runner)[RANGES_ATTRIBUTE] = install_layer_ranges(model, ubatch_of)
    except Exception as error:  # ranges must never fail the plugin's forward
        vars(runner)[RANGES_ATTRIBUTE] = repr(error)
        logger.warning("afd_split: no layer/stage profiler ranges on this runner: %s", error)
