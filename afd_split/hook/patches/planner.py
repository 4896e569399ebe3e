"""The three compatibility patches of the AFD plugin, written to its AGENTS.md rules.

Each patch function carries the pinned upstream header exactly (``pinned.py``),
has its reason and behaviour in the comment right above it, and marks every
AFD-split-only delta with ``# ### PATCH START/END``. All three deviate from the
"copy the upstream body" default in the same, called-out way: every value of
``async_moe_split`` other than ``token_balanced`` delegates to the ORIGINAL
function object, so the plugin runs byte-for-byte unchanged (this project reads
upstream for facts and does not copy its code). The factories close over the
original; nothing is stored in a module global.

Removal plan (docs/ascend.md): upstream an ``async_moe_split`` planner registry
to afd-plugin (plan function + metadata splitter per value); then this module
shrinks to one registration call and the seams stop being patched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from afd_split.engine.state import preserved_state
from afd_split.hook.facts.pcp_drift import pcp_seam_unavailable
from afd_split.hook.facts.pinned import (
    PLANNER,
    RELEASE_V0_19_1RC1,
    SLICER,
    VALIDATOR,
    function_header,
    seams_for,
)
from afd_split.hook.glue.builder_state import (
    builder_state_targets,
    metadata_builders,
    own_stage_views,
    stage_written_buffers,
)
from afd_split.hook.glue.pcp_seam import (
    check_rebuilt_stages,
    pcp_enabled,
    plan_pcp_runner_stages,
)
from afd_split.hook.planning.rules import (
    NO_PCP_SEAM,
    token_balanced_unsupported_reasons,
)
from afd_split.hook.planning.stages import (
    SESSION_ATTRIBUTE,
    TOKEN_BALANCED_SPLIT,
    HookSession,
    PlannedUBatchSlices,
    plan_stages,
)

if TYPE_CHECKING:  # names of the pinned headers; never imported at run time
    import torch
    from afd_plugin.config import AFDConfig
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.utils import CommonAttentionMetadata
    from vllm.v1.worker.ubatch_utils import UBatchSlices
    from vllm_ascend.attention.utils import AscendCommonAttentionMetadata
    from vllm_ascend.worker.model_runner_v1 import PerLayerAttnMetadata

PATCH_MARKER = "__afd_split_patch__"
"""Attribute on every patch function naming its seam; makes installation idempotent."""

RUNNER_STATE_KEPT_ACROSS_STAGE_BUILD = ("long_seq_metadata", "input_batch")
"""Runner state the full-batch build sets for the full-batch forward and the stage build
overwrites (``input_batch``: swapped per stage under PCP, ``pcp_seam``); ``preserved_state``
restores it so the stages never leak into the parent. The builders' bindings and the
buffers a stage build writes through are restored with it (``builder_state``)."""



class PluginDriftError(RuntimeError):
    """The installed afd_plugin's seam no longer reads as any pinned variant (``seam``: its
    ``pinned`` key, so the import hook can leave the module unpatched and name it)."""

    def __init__(self, message: str, *, seam: str | None = None) -> None:
        super().__init__(message)
        self.seam = seam


@dataclass(frozen=True)
class PluginSeams:
    """The upstream objects the hook patches (modules of the installed plugin, or stand-ins)."""

    runner_module: ModuleType
    runner_class: type
    slice_type: type
    forward_module: ModuleType | None = None
    """The async-MoE pipeline's module (PCP stages); None: imported at the first PCP step."""
    drifted: Callable[[], tuple[str, ...]] | None = None
    """Why token_balanced is refused after a seam drifted (``drift_guard.DriftLog.reasons``,
    read when a step is planned); None: no import hook watches the seams."""


def seams_of(runner_module: ModuleType) -> PluginSeams:
    """The seams around a loaded runner module (whose own imports loaded the rest)."""
    from vllm.v1.worker.ubatch_utils import UBatchSlice

    from afd_split.hook.facts.pinned import RUNNER_CLASS

    return PluginSeams(runner_module=runner_module, runner_class=vars(runner_module)[RUNNER_CLASS],
                       slice_type=UBatchSlice)


def plugin_request_split() -> str:
    """afd_plugin's own request-boundary split value, read when the validator first runs
    (in a worker: its connector module is loaded by then, never at registration)."""
    from afd_plugin.connectors.npu.async_cam import ASYNC_MOE_REQUEST_SPLIT

    return ASYNC_MOE_REQUEST_SPLIT


def no_pcp_seam() -> str:
    """A validator's PCP answer when no runner seam was checked: PCP refused."""
    return NO_PCP_SEAM


def no_drift_seen() -> tuple[str, ...]:
    """A validator's drift answer where no import hook watches the seams."""
    return ()


def make_validator_patch(original: Callable, request_split: Callable[[], str],
                         pcp_unavailable: Callable[[], str | None] = no_pcp_seam,
                         drifted: Callable[[], tuple[str, ...]] = no_drift_seen) -> Callable:
    # Upstream source: afd-plugin main 2e4378f / release/v0.19.1rc1 2f4f462,
    # compat/npu/feature_validation.py _fail_if_unsupported_npu_async_moe_ubatching_features.
    # Patch reason: the validator accepts only async_moe_split="request" and
    # refuses every other value at worker start.
    # Patch functionality: "token_balanced" runs the plugin's own checks (called
    # with the request value, so they stay upstream's) plus afd_split's support
    # rules, failing closed with every reason before any connector exists.
    # Delegation exception: every other value calls the original unchanged.
    # Signature: matches upstream; no added parameters. ``request_split()`` gives the
    # plugin's request value, read at call time (the connector module loads with the worker);
    # ``pcp_unavailable()`` why PCP cannot run here (None: the release seam is there), also
    # read at call time: with deferred registration the validation module is patched
    # before the runner module loads. ``drifted()`` names the seams the import hook left
    # unpatched (drift_guard): token_balanced is refused naming them.
    def _fail_if_unsupported_npu_async_moe_ubatching_features(vllm_config: VllmConfig, afd_config: AFDConfig, *, num_ubatches: int, split: str) -> None:
        # ### PATCH START: afd_split token_balanced value
        if split == TOKEN_BALANCED_SPLIT:
            original(vllm_config, afd_config, num_ubatches=num_ubatches, split=request_split())
            reasons = [*drifted(), *token_balanced_unsupported_reasons(
                vllm_config, afd_config, num_ubatches, pcp_unavailable())]
            if reasons:
                raise RuntimeError(
                    f"async_moe_split={split!r} is unsupported here: " + "; ".join(reasons)
                )
            return None
        # ### PATCH END: afd_split token_balanced value
        return original(vllm_config, afd_config, num_ubatches=num_ubatches, split=split)

    setattr(_fail_if_unsupported_npu_async_moe_ubatching_features, PATCH_MARKER, VALIDATOR)
    return _fail_if_unsupported_npu_async_moe_ubatching_features


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


def runner_session(runner, new_session: Callable[[Any], HookSession]) -> HookSession:
    """The runner's ``HookSession``, created on its first token_balanced step."""
    session = vars(runner).get(SESSION_ATTRIBUTE)
    if session is None:
        from afd_split.hook.patches.dispatch import attach_recorder

        session = new_session(runner)
        vars(runner)[SESSION_ATTRIBUTE] = session
        attach_recorder(runner.connector, session.expert_load)
    return session


def plan_runner_stages(runner, num_scheduled_tokens_np: np.ndarray, seams: PluginSeams,
                       new_session: Callable[[Any], HookSession],
                       num_tokens_padded: int | None = None) -> PlannedUBatchSlices | None:
    """Plan from the host arrays the pinned runner already holds (no device reads)."""
    num_reqs = len(num_scheduled_tokens_np)
    session = runner_session(runner, new_session)
    computed = runner.input_batch.num_computed_tokens_cpu_tensor[:num_reqs].numpy()
    if pcp_enabled(session.alignment.pcp_size):
        return plan_pcp_runner_stages(runner, session, num_reqs, computed,
                                      seams.slice_type, seams.forward_module)
    return plan_stages(
        session,
        num_scheduled_tokens_np,
        num_computed_tokens=computed,
        block_size=runner.cache_config.block_size,
        slice_type=seams.slice_type,
        num_input_tokens=num_tokens_padded,
    )


def build_token_balanced_stages(runner, full_metadata, num_tokens: int,
                                num_scheduled_tokens_np, seams: PluginSeams,
                                new_session: Callable[[Any], HookSession],
                                stage_arguments: Callable[[PlannedUBatchSlices], tuple],
                                num_tokens_padded: int | None = None):
    """The AFD-only body both branches' planner patches share, after the full-batch build.

    Plans the stages with afd_split and builds their metadata with the runner's
    ``_build_attention_metadata_with_ubatches``; ``stage_arguments(stage_slices)``
    gives its ``(args, kwargs)`` on the branch's own calling convention (the one
    part the branches do differently). Returns ``full_metadata``; the stage
    metadata goes to the runner's AFD attributes.
    """
    drift_reasons = seams.drifted() if seams.drifted is not None else ()
    if drift_reasons:  # the validator's own module may be the drifted one: refuse here too
        raise PluginDriftError(f"async_moe_split={TOKEN_BALANCED_SPLIT!r} is refused: "
                               + "; ".join(drift_reasons))
    runner._afd_async_moe_ubatch_metadata = None
    runner._afd_pending_metadata = runner._build_afd_metadata(None, num_tokens)
    if num_scheduled_tokens_np is None:
        return full_metadata
    stage_slices = plan_runner_stages(runner, num_scheduled_tokens_np, seams, new_session,
                                      num_tokens_padded)
    if stage_slices is None:
        return full_metadata
    stage_args, stage_kwargs = stage_arguments(stage_slices)
    builders = metadata_builders(runner)
    buffers = stage_written_buffers(builders, getattr(runner, "pcp_manager", None))
    with preserved_state((runner, RUNNER_STATE_KEPT_ACROSS_STAGE_BUILD),
                         *builder_state_targets(builders, buffers)):
        stage_attn_metadata, _ = runner._build_attention_metadata_with_ubatches(
            *stage_args, **stage_kwargs
        )
        own_stage_views(stage_attn_metadata, buffers)  # before the buffers are restored
    if stage_slices.pcp is not None:
        check_rebuilt_stages(stage_slices.pcp)
    runner._afd_pending_metadata = runner._build_afd_metadata(stage_slices, num_tokens)
    runner._afd_async_moe_ubatch_metadata = {
        "attn_metadata": stage_attn_metadata,
        "ubatch_slices": stage_slices,
    }
    return full_metadata


def make_planner_patch_main(original: Callable, seams: PluginSeams,
                            new_session: Callable[[Any], HookSession]) -> Callable:
    runner_class = seams.runner_class

    # Upstream source: afd-plugin main 2e4378f, v1/worker/npu/attention_model_runner.py
    # AFDNPUAttentionModelRunner._build_attention_metadata_with_async_moe_ubatches.
    # Patch reason: the plugin plans async-MoE stages only on request boundaries
    # (create_request_boundary_ubatch_slices), so a long request cannot be balanced.
    # Patch functionality: async_moe_split="token_balanced" plans with afd_split
    # (cut inside a request), then builds stage metadata through the runner's own
    # _build_attention_metadata_with_ubatches with PlannedUBatchSlices, which the
    # patched split_attn_metadata slices with afd_split's adapter.
    # Delegation exception: every other value calls the original unchanged.
    # Signature: matches upstream; no added parameters.
    def _build_attention_metadata_with_async_moe_ubatches(self, num_tokens: int, num_reqs: int, max_query_len: int, num_tokens_padded: int | None, num_reqs_padded: int | None, ubatch_slices: UBatchSlices | None, logits_indices: torch.Tensor | None, use_spec_decode: bool, for_cudagraph_capture: bool, num_scheduled_tokens: dict[str, int] | None, num_scheduled_tokens_np: np.ndarray | None, cascade_attn_prefix_lens: list[list[int]] | None) -> tuple[PerLayerAttnMetadata, CommonAttentionMetadata | None]:
        # ### PATCH START: afd_split token_balanced stages
        metadata_kwargs = {
            "num_tokens": num_tokens, "num_reqs": num_reqs, "max_query_len": max_query_len,
            "num_tokens_padded": num_tokens_padded, "num_reqs_padded": num_reqs_padded,
            "ubatch_slices": ubatch_slices, "logits_indices": logits_indices,
            "use_spec_decode": use_spec_decode, "for_cudagraph_capture": for_cudagraph_capture,
            "num_scheduled_tokens": num_scheduled_tokens,
            "num_scheduled_tokens_np": num_scheduled_tokens_np,
            "cascade_attn_prefix_lens": cascade_attn_prefix_lens,
        }
        if self.afd_async_extra_info.async_moe_split != TOKEN_BALANCED_SPLIT:
            return original(self, **metadata_kwargs)
        full_metadata = super(runner_class, self)._build_attention_metadata(**metadata_kwargs)
        return build_token_balanced_stages(
            self, full_metadata, num_tokens, num_scheduled_tokens_np, seams, new_session,
            lambda stage_slices: ((), {**metadata_kwargs, "ubatch_slices": stage_slices}),
            num_tokens_padded,
        )
        # ### PATCH END: afd_split token_balanced stages

    setattr(_build_attention_metadata_with_async_moe_ubatches, PATCH_MARKER, PLANNER)
    return _build_attention_metadata_with_async_moe_ubatches


def make_planner_patch_release(original: Callable, seams: PluginSeams,
                               new_session: Callable[[Any], HookSession]) -> Callable:
    runner_class = seams.runner_class
    replace_slices = vars(seams.runner_module)["_replace_attention_metadata_ubatch_slices"]

    # Upstream source: afd-plugin release/v0.19.1rc1 2f4f462, same method as on main;
    # on this branch it takes the caller's (args, kwargs, values) and rebinds
    # ubatch_slices with _replace_attention_metadata_ubatch_slices.
    # Patch reason and functionality: as make_planner_patch_main. Under PCP (only this
    # branch has the per-stage rebuild, drift-checked by pcp_seam.pcp_seam_unavailable)
    # the stages are planned on the global query_lens_pcp_full (a cut may fall inside a
    # request) and laid out each as its own zigzag (pcp_seam.PcpStages, moved by the
    # forward patch); the stage build's inner _build_stage_local_pcp_metadata reads the
    # stage's pieces and a stage-local input_batch per stage (fixes upstream's whole-batch
    # input_batch; removal plan in docs/ascend.md).
    # Delegation exception: every other value calls the original unchanged.
    # Signature: matches upstream; no added parameters.
    def _build_attention_metadata_with_async_moe_ubatches(self, args: tuple[Any, ...], kwargs: dict[str, Any], values: dict[str, Any]) -> Any:
        # ### PATCH START: afd_split token_balanced stages
        if self.afd_async_extra_info.async_moe_split != TOKEN_BALANCED_SPLIT:
            return original(self, args, kwargs, values)
        full_metadata = super(runner_class, self)._build_attention_metadata(*args, **kwargs)
        num_tokens = int(values.get("num_tokens", 0))
        return build_token_balanced_stages(
            self, full_metadata, num_tokens, values.get("num_scheduled_tokens_np"), seams,
            new_session, lambda stage_slices: replace_slices(args, kwargs, stage_slices),
            values.get("num_tokens_padded"),
        )
        # ### PATCH END: afd_split token_balanced stages

    setattr(_build_attention_metadata_with_async_moe_ubatches, PATCH_MARKER, PLANNER)
    return _build_attention_metadata_with_async_moe_ubatches


PLANNER_PATCHES = {"main": make_planner_patch_main,
                   RELEASE_V0_19_1RC1[0]: make_planner_patch_release}
"""Planner patch factory per pinned branch (the two branches' headers differ)."""


def installed_branch(key: str, function: Callable) -> str:
    """The pinned branch whose header ``function`` carries; PluginDriftError when none does."""
    header = function_header(function)
    variants = seams_for(key)
    for seam in variants:
        if seam.normalized_header == header:
            return seam.branch
    pinned = "; ".join(f"{seam.branch}@{seam.commit[:12]}: {seam.normalized_header}"
                       for seam in variants)
    raise PluginDriftError(
        f"afd_plugin seam {variants[0].module}.{variants[0].qualname} drifted: installed "
        f"header {header!r} matches no pinned variant ({pinned}); re-pin it (AGENTS.md) before "
        f"async_moe_split={TOKEN_BALANCED_SPLIT!r} can run", seam=key,
    )


VALIDATOR_NAME = "_fail_if_unsupported_npu_async_moe_ubatching_features"
PLANNER_NAME = "_build_attention_metadata_with_async_moe_ubatches"
SLICER_NAME = "split_attn_metadata"


def install_validator(validation_module: ModuleType, request_split: Callable[[], str],
                      pcp_unavailable: Callable[[], str | None] = no_pcp_seam,
                      drifted: Callable[[], tuple[str, ...]] = no_drift_seen) -> bool:
    """Patch the validator seam of a loaded validation module (drift-checked, idempotent);
    True when it was patched now."""
    validator = vars(validation_module)[VALIDATOR_NAME]
    if getattr(validator, PATCH_MARKER, None) == VALIDATOR:
        return False
    installed_branch(VALIDATOR, validator)
    setattr(validation_module, VALIDATOR_NAME,
            make_validator_patch(validator, request_split, pcp_unavailable, drifted))
    return True


RUNNER_NOT_LOADED = "the afd-plugin runner module is not loaded, so no per-stage PCP rebuild was checked"


def runner_pcp_unavailable(runner_module: ModuleType | None) -> str | None:
    """Why PCP cannot run with this runner module (None: the pinned release seam is there);
    the planner's pinned header names the branch, patched or not (the patch keeps it)."""
    from afd_split.hook.facts.pinned import RUNNER_CLASS

    if runner_module is None:
        return RUNNER_NOT_LOADED
    runner_class = vars(runner_module)[RUNNER_CLASS]
    return pcp_seam_unavailable(runner_class,
                                installed_branch(PLANNER, vars(runner_class)[PLANNER_NAME]))


def install_runner(seams: PluginSeams, *, new_session: Callable[[Any], HookSession]) -> str:
    """Patch the planner and slicer seams of a loaded runner module (both drift-checked
    before either is patched; idempotent); returns the branch recognised."""
    planner = vars(seams.runner_class)[PLANNER_NAME]
    slicer = vars(seams.runner_module)[SLICER_NAME]
    if getattr(planner, PATCH_MARKER, None) == PLANNER:  # our own attribute, set below
        return "already-installed"
    branch = installed_branch(PLANNER, planner)
    installed_branch(SLICER, slicer)
    setattr(seams.runner_module, SLICER_NAME, make_slicer_patch(slicer))
    setattr(seams.runner_class, PLANNER_NAME, PLANNER_PATCHES[branch](planner, seams, new_session))
    return branch
