"""Structural stand-ins of the AFD plugin's patched seams, built from the pinned headers.

The Ascend common metadata comes from adapt's stand-ins (pinned field lists of
vLLM-Ascend v0.19.1rc1 and v0.26.0rc) so the hook runs the real Ascend adapter.

afd_plugin cannot be installed here (it needs vLLM-Ascend, torch-npu and CANN),
so the hook is exercised against real Python modules written from
``pinned.PINNED_SEAMS``: every patched function carries the pinned header
verbatim, and each body does what the fact sheet says upstream does at that
seam (the validator refuses every split but ``request``; the stage builder
calls the runner module's ``split_attn_metadata`` once per attention group).
Tests register them under the pinned module names (``register_standins``) and install
the hook with ``install.install_deferred``, exactly as a worker's registration does.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

from afd_split.hook.facts.pcp_drift import STAGE_PCP_REBUILD_HEADER
from afd_split.hook.facts.pinned import (
    DISPATCH,
    EXTRA_INFO,
    EXTRA_INFO_MODULE,
    FORWARD,
    FORWARD_MODULE,
    PLANNER,
    RUNNER_MODULE,
    SLICER,
    VALIDATION_MODULE,
    VALIDATOR,
    normalize_header,
    variant_for_branch,
)
from afd_split.hook.install import SeamImportHook

BLOCK_SIZE = 16
"""adapter_batches.BLOCK: the stand-in batches' KV block size."""
REQUEST_SPLIT = "request"
_MODULE_IDS = itertools.count()


@dataclasses.dataclass(frozen=True)
class StandInUBatchSlice:
    """vLLM's UBatchSlice fields (request_slice, token_slice)."""

    request_slice: slice
    token_slice: slice

    @property
    def num_tokens(self) -> int:
        return self.token_slice.stop - self.token_slice.start


ENTRY_VALIDATOR_HEADER = ("def fail_if_unsupported_npu_afd_features(vllm_config, *, "
                          "afd_config=None) -> None: ...")
"""afd-plugin's entry validator (``compat/npu/feature_validation.py``, what the runner's and
workers' ``__init__`` call): the stand-in config carries ``connector_extra_config`` itself."""

EXTRA_INFO_CLASS = '''
@dataclasses.dataclass(frozen=True)
class AFDAsyncExtraInfo:
    async_moe_ubatching: bool = False
    async_moe_num_ubatches: int = 2
    async_moe_split: str = ASYNC_MOE_REQUEST_SPLIT

    @classmethod
    def from_mapping(cls, raw):
        raw = raw or {}
        return cls(async_moe_ubatching=bool(raw.get("async_moe_ubatching", False)),
                   async_moe_num_ubatches=int(raw.get("async_moe_num_ubatches", 2)),
                   async_moe_split=str(raw.get("async_moe_split", ASYNC_MOE_REQUEST_SPLIT)))
'''
"""The async-MoE fields of afd-plugin's ``AFDAsyncExtraInfo`` (2e4378f / 2f4f462)."""


def _body(header: str, lines: list[str]) -> str:
    return header.rsplit("...", 1)[0] + "\n" + "".join(f"    {line}\n" for line in lines)


def _indent(text: str) -> str:
    return "".join(f"    {line}\n" if line else "\n" for line in text.splitlines())


def standin_source(branch: str, header_overrides: dict[str, str] | None = None) -> tuple[str, str]:
    """(validation module source, runner module source) for ``branch``."""
    overrides = header_overrides or {}

    def header(key: str) -> str:
        return normalize_header(overrides.get(key, variant_for_branch(key, branch).header))

    entry = _body(ENTRY_VALIDATOR_HEADER, [
        "import importlib",
        "",
        f"connector = importlib.import_module({EXTRA_INFO_MODULE!r}).CAMAsyncAFDConnector",
        "extra_info = connector.parse_extra_config(vllm_config.connector_extra_config)",
        "if extra_info.async_moe_ubatching:",
        "    _fail_if_unsupported_npu_async_moe_ubatching_features(",
        "        vllm_config, afd_config, num_ubatches=extra_info.async_moe_num_ubatches,",
        "        split=extra_info.async_moe_split)",
    ])
    validation = _body(header(VALIDATOR), [
        "CALLS.append(('validator', split, num_ubatches))",
        f"if split != {REQUEST_SPLIT!r}:",
        "    raise RuntimeError('async_moe_ubatching currently supports only request-boundary "
        "split; got async_moe_split=%r' % split)",
        "if num_ubatches != 2:",
        "    raise RuntimeError('async_moe_ubatching currently supports exactly two stages')",
    ])
    slicer = _body(header(SLICER), [
        "CALLS.append(('plugin_slicer', ubatch_slices))",
        "return ['plugin-stage'] * len(ubatch_slices)",
    ])
    if branch == "main":
        planner_lines = ["CALLS.append(('plugin_planner', num_scheduled_tokens_np))",
                         "return 'plugin-full'"]
        build = (
            "def _build_attention_metadata_with_ubatches(self, **kwargs):\n"
            "    CALLS.append(('stage_build', kwargs['ubatch_slices']))\n"
            "    self.long_seq_metadata = 'stage-local'\n"
            "    stages = split_attn_metadata(kwargs['ubatch_slices'], self.common, "
            "kwargs['num_tokens_padded'])\n"
            "    return stages, None\n"
        )
        replace = ""
    else:
        planner_lines = ["CALLS.append(('plugin_planner', values.get('num_scheduled_tokens_np')))",
                         "return 'plugin-full'"]
        # The pinned stage build's PCP facts (release/v0.19.1rc1 2f4f462): per attention
        # group it slices with split_attn_metadata and, while iterating the result with
        # enumerate, runs the inner rebuild per stage. The rebuild reads the stage's counts
        # from query_lens_pcp_full.cpu[:num_reqs][request_slice] and its token range from
        # the sums before request_slice.start / .stop, re-runs the manager's helpers with
        # self.input_batch, pads the slots of input_batch.block_table[gid].slot_mapping.gpu
        # of that range, stores clones of what it built, and restores the manager. It first
        # pads the full batch's slots again (_get_block_table_and_slot_mapping(0)) and builds
        # stage ubid with attn_group.get_metadata_builder(ubid or 0): stage 0 shares builder
        # 0 with the full batch (vllm-ascend da421af NPUModelRunner._build_attention_metadata).
        build = (
            "def _build_attention_metadata_with_ubatches(self, *args, **kwargs):\n"
            "    CALLS.append(('stage_build', kwargs['ubatch_slices']))\n"
            "    self.long_seq_metadata = 'stage-local'\n"
            "    ubatch_slices = kwargs['ubatch_slices']\n"
            "    num_reqs = kwargs['num_reqs']\n\n"
            f"    {STAGE_PCP_REBUILD_HEADER.rsplit('...', 1)[0]}\n"
            "        if not self.use_cp:\n"
            "            return\n"
            "        full = self.pcp_manager.query_lens_pcp_full.cpu[:num_reqs].numpy().copy()\n"
            "        original = full[ubatch_slice.request_slice].copy()\n"
            "        start = int(full[:ubatch_slice.request_slice.start].sum())\n"
            "        stop = int(full[:ubatch_slice.request_slice.stop].sum())\n"
            "        stage_num_reqs = ubatch_slice.request_slice.stop - "
            "ubatch_slice.request_slice.start\n"
            "        state = self.pcp_manager.snapshot()\n"
            "        try:\n"
            "            self.pcp_manager.init_batch_info(original, stage_num_reqs)\n"
            "            rank_rows, _ = self.pcp_manager.update_tokens_for_pcp(original, None)\n"
            "            metadata, table = self.pcp_manager.generate_pcp_metadata(\n"
            "                int(common_attn_metadata.num_actual_tokens), rank_rows,\n"
            "                self.input_batch, rank_rows, common_attn_metadata.block_table_tensor,\n"
            "                stage_num_reqs, stage_num_reqs)\n"
            "            raw = self.input_batch.block_table[kv_cache_gid].slot_mapping.gpu[\n"
            "                start:stop]\n"
            "            rows = int(rank_rows.sum())\n"
            "            common_attn_metadata.slot_mapping = (\n"
            "                self.pcp_manager.get_padded_slot_mapping(rows, rows, raw,\n"
            "                                                         kv_cache_gid).clone())\n"
            "            common_attn_metadata.prefill_context_parallel_metadata = copy.deepcopy(\n"
            "                metadata)\n"
            "            common_attn_metadata.block_table_tensor = table\n"
            "            STAGE_REBUILDS.append((ubid, common_attn_metadata))\n"
            "        finally:\n"
            "            self.pcp_manager.restore(state)\n\n"
            "    groups = getattr(self, 'attn_groups', None)\n"
            "    if groups:  # _get_block_table_and_slot_mapping(0): the full batch padded again\n"
            "        self.full_batch_slots()\n"
            "    ubatch_common_metadata = split_attn_metadata(ubatch_slices, self.common, 0)\n"
            "    built = []\n"
            "    for ubid, ubatch_cm in enumerate(ubatch_common_metadata):\n"
            "        _build_stage_local_pcp_metadata(ubatch_cm, ubatch_slices[ubid], ubid, 0, 0)\n"
            "        built.append(ubatch_cm if not groups else\n"
            "                     groups[0][0].get_metadata_builder(ubid or 0).build(0, ubatch_cm))\n"
            "    return built, None\n"
        )
        replace = (
            "def _replace_attention_metadata_ubatch_slices(args, kwargs, ubatch_slices):\n"
            "    return args, {**kwargs, 'ubatch_slices': ubatch_slices}\n"
        )
    runner = (
        "import copy\n\nCALLS = []\nSTAGE_REBUILDS = []\n\n"
        + slicer + "\n" + replace + "\n"
        "class NPUModelRunner:\n"
        "    def _build_attention_metadata(self, *args, **kwargs):\n"
        "        CALLS.append(('full_build', kwargs.get('num_tokens')))\n"
        "        if getattr(self, 'attn_groups', None):  # builder 0, as vllm-ascend does\n"
        "            return self.attn_groups[0][0].get_metadata_builder(0).build(\n"
        "                0, self.full_batch_common())\n"
        "        return 'full-metadata'\n\n"
        "class AFDNPUAttentionModelRunner(NPUModelRunner):\n"
        "    use_cp = False\n\n"
        + _indent(_body(header(PLANNER), planner_lines)) + "\n"
        + _indent(build) + "\n"
        "    def _build_afd_metadata(self, ubatch_slices, num_tokens):\n"
        "        return ('afd-metadata', None if ubatch_slices is None else len(ubatch_slices),"
        " num_tokens)\n"
    )
    future = "from __future__ import annotations\n\n"
    return future + "CALLS = []\n\n" + entry + "\n\n" + validation, future + runner


def standin_connector_source(branch: str, header_overrides: dict[str, str] | None = None) -> str:
    """Connector module source of ``branch``: ``CAMAsyncAFDConnector.send_attn_output`` with
    the pinned header, checking the top-k payload shape as upstream does, then recording the
    dispatch (the CAM op upstream issues); ``parse_extra_config`` (pinned header) parses the
    async-MoE keys of ``connector_extra_config`` into ``AFDAsyncExtraInfo``, whose
    ``async_moe_split`` is a free string (``coerce_extra_str`` at 2e4378f / 2f4f462)."""
    overrides = header_overrides or {}
    header = normalize_header(overrides.get(DISPATCH, variant_for_branch(DISPATCH, branch).header))
    parse = _body(normalize_header(overrides.get(
        EXTRA_INFO, variant_for_branch(EXTRA_INFO, branch).header)), [
        "CALLS.append(('parse_extra_config',))",
        "return AFDAsyncExtraInfo.from_mapping(raw)",
    ])
    send = _body(header, [
        "topk_ids = kwargs.get('topk_ids')",
        "if topk_ids is None or tuple(topk_ids.shape) != (context.metadata.total_tokens, "
        "self.topk):",
        "    raise ValueError('topk_ids shape must match the stage tokens and top_k')",
        "CALLS.append(('dispatch', context.metadata.layer_idx, context.metadata.stage_idx))",
    ])
    return (
        "from __future__ import annotations\n\nimport dataclasses\n\n"
        f"ASYNC_MOE_REQUEST_SPLIT = {REQUEST_SPLIT!r}\n"
        "CALLS = []\n\n\n" + EXTRA_INFO_CLASS + "\n\n"
        "class CAMAsyncAFDConnector:\n"
        "    @classmethod\n" + _indent(parse) + "\n"
        "    def __init__(self, *, topk, num_routed_experts, expert_per_rank):\n"
        "        self.topk = topk\n"
        "        self.num_routed_experts = num_routed_experts\n"
        "        self.expert_per_rank = expert_per_rank\n\n"
        + _indent(send)
    )


def standin_forward_source(branch: str, header_overrides: dict[str, str] | None = None) -> str:
    """The async-MoE pipeline module of ``branch``: ``run_async_moe_ubatch_afd_forward`` with
    the pinned header doing what upstream does at 2e4378f / 2f4f462, on layers called as
    ``layer(positions, hidden_states, residual)``: the layers before
    ``config.first_k_dense_replace`` on the whole batch (returning when no MoE layer
    follows), then every MoE layer on each stage's rows (``UBatchSlice.token_slice``; a
    missing residual stays None, ``_slice_optional_first_dim``), stage by stage, and the
    stages' rows concatenated."""
    header = normalize_header((header_overrides or {}).get(
        FORWARD, variant_for_branch(FORWARD, branch).header))
    body = _body(header, [
        "CALLS.append(('forward', model.start_layer, model.end_layer))",
        "first_moe_layer = int(model.config.first_k_dense_replace)",
        "dense_end_layer = min(model.end_layer, first_moe_layer)",
        "for layer in islice(model.layers, model.start_layer, dense_end_layer):",
        "    hidden_states, residual = layer(positions, hidden_states, residual)",
        "if dense_end_layer == model.end_layer:",
        "    return hidden_states, residual",
        "ubatch_slices = async_moe_ubatch_metadata['ubatch_slices']",
        "hidden = [hidden_states[ubatch_slice.token_slice] for ubatch_slice in ubatch_slices]",
        "rest = [None if residual is None else residual[ubatch_slice.token_slice] "
        "for ubatch_slice in ubatch_slices]",
        "where = [positions[ubatch_slice.token_slice] for ubatch_slice in ubatch_slices]",
        "for layer in islice(model.layers, max(model.start_layer, first_moe_layer), "
        "model.end_layer):",
        "    for stage in range(len(ubatch_slices)):",
        "        hidden[stage], rest[stage] = layer(where[stage], hidden[stage], rest[stage])",
        "return torch.cat(hidden), torch.cat(rest)",
    ])
    return ("from __future__ import annotations\n\nfrom itertools import islice\n\n"
            "import torch\n\nCALLS = []\n\n\n" + body)


def _load(path: Path, source: str):
    path.write_text(source)
    name = f"afd_split_standin_{path.stem}_{next(_MODULE_IDS)}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # inspect.getsource needs the module registered
    spec.loader.exec_module(module)
    return module


UBATCH_UTILS_MODULE = "vllm.v1.worker.ubatch_utils"
"""Where the hook's runner patch reads vLLM's ``UBatchSlice`` (``glue.runner.seams_of``)."""


def ubatch_utils_module(slice_type=StandInUBatchSlice) -> ModuleType:
    module = ModuleType(UBATCH_UTILS_MODULE)
    module.UBatchSlice = slice_type
    return module


def register_standins(monkeypatch, modules: dict[str, ModuleType],
                      slice_type=StandInUBatchSlice) -> None:
    """Put stand-in modules where afd_plugin's own would be loaded (``sys.modules`` under the
    pinned names, vLLM's ``UBatchSlice`` beside them) and give the test a ``sys.meta_path``
    without a seam import hook: ``install_deferred`` then runs exactly as in a fresh worker
    (it patches the loaded modules at once). Undone when the test ends."""
    monkeypatch.setattr(sys, "meta_path",
                        [finder for finder in sys.meta_path
                         if not isinstance(finder, SeamImportHook)])
    monkeypatch.setitem(sys.modules, UBATCH_UTILS_MODULE, ubatch_utils_module(slice_type))
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)


def _adapter_batches():
    """The adapters' stand-in builders (``tests.support.adapter_batches``)."""
    from tests.support import adapter_batches

    return adapter_batches


def ascend_common(layout, num_scheduled, num_computed):
    """(AscendCommonAttentionMetadata stand-in at ``layout``'s tag, BatchMetadata of the real
    part) of a padded prefix-hit prefill batch, as vLLM-Ascend's runner holds it."""
    batches = _adapter_batches()
    states = batches.attn_state_enum(layout)
    common, _, meta = batches.build_common(batches.standin_class(layout), layout,
                                           tuple(num_scheduled), tuple(num_computed),
                                           attn_state=states.PrefillCacheHit)
    return common, meta


@dataclasses.dataclass(frozen=True)
class StandinPlugin:
    """Freshly loaded stand-in seam modules of one branch."""

    validation_module: ModuleType
    runner_module: ModuleType
    connector_module: ModuleType
    forward_module: ModuleType

    @property
    def runner_class(self) -> type:
        return self.runner_module.AFDNPUAttentionModelRunner

    def by_pinned_name(self) -> dict[str, ModuleType]:
        return {VALIDATION_MODULE: self.validation_module, RUNNER_MODULE: self.runner_module,
                EXTRA_INFO_MODULE: self.connector_module, FORWARD_MODULE: self.forward_module}


def load_standin_plugin(folder: Path, branch: str = "main",
                        header_overrides: dict[str, str] | None = None) -> StandinPlugin:
    """Freshly loaded stand-in modules of ``branch`` (written to ``folder``)."""
    validation_source, runner_source = standin_source(branch, header_overrides)
    folder.mkdir(parents=True)
    return StandinPlugin(
        validation_module=_load(folder / "feature_validation.py", validation_source),
        runner_module=_load(folder / "attention_model_runner.py", runner_source),
        connector_module=_load(folder / "async_cam.py",
                               standin_connector_source(branch, header_overrides)),
        forward_module=_load(folder / "deepseek_v2_async_cam_forward.py",
                             standin_forward_source(branch, header_overrides)))


def call_planner(runner, branch: str, scheduled):
    """Call the runner's async-MoE planner as the plugin's forward does on ``branch``: main
    passes the pinned keywords, release/v0.19.1rc1 its ``(args, kwargs, values)`` form."""
    tokens = np.asarray(scheduled, dtype=np.int64)
    kwargs = {"num_tokens": int(tokens.sum()), "num_reqs": len(tokens),
              "max_query_len": int(tokens.max()), "num_tokens_padded": int(tokens.sum()),
              "num_reqs_padded": len(tokens), "ubatch_slices": None, "logits_indices": None,
              "use_spec_decode": False, "for_cudagraph_capture": False,
              "num_scheduled_tokens": None, "num_scheduled_tokens_np": tokens,
              "cascade_attn_prefix_lens": None}
    method = runner._build_attention_metadata_with_async_moe_ubatches
    if branch == "main":
        return method(**kwargs)
    return method((), kwargs, kwargs)
