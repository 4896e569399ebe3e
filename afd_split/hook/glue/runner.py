"""The runner-level token_balanced step the planner patch runs, and the seams it reads.

Plans the step (``planning.stages``, or the PCP stage seam), builds the stages'
metadata through the runner's own ``_build_attention_metadata_with_ubatches`` while
the full batch's runner and builder state is preserved (``builder_state``), and
refuses ``token_balanced`` naming any seam the import hook left unpatched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from afd_split.engine.state import preserved_state
from afd_split.hook.facts.drift_guard import drift_refusal, installed_branch
from afd_split.hook.facts.pcp_drift import pcp_seam_unavailable
from afd_split.hook.facts.pinned import PLANNER, PLANNER_NAME, RUNNER_CLASS
from afd_split.hook.glue.builder_state import (
    builder_state_targets,
    metadata_builders,
    own_stage_views,
    stage_write_bound,
    stage_written_buffers,
)
from afd_split.hook.glue.pcp_seam import (
    check_rebuilt_stages,
    plan_pcp_runner_stages,
    runner_computed_tokens,
)
from afd_split.hook.glue.step_facts import runner_step_facts
from afd_split.hook.planning.rules import pcp_enabled
from afd_split.hook.planning.stages import (
    SESSION_ATTRIBUTE,
    HookSession,
    PlannedUBatchSlices,
    plan_stages,
)

RUNNER_STATE_KEPT_ACROSS_STAGE_BUILD = ("long_seq_metadata", "input_batch")
"""Runner state the full-batch build sets for the full-batch forward and the stage build
overwrites (``input_batch``: swapped per stage under PCP, ``pcp_seam``); ``preserved_state``
restores it so the stages never leak into the parent. The builders' bindings and the
buffers a stage build writes through are restored with it (``builder_state``)."""

EXPERT_LOAD_ATTRIBUTE = "_afd_split_expert_load"
"""AFD-only connector attribute holding the runner session's ``ExpertLoadRecorder`` (the
dispatch patch counts into it)."""

NO_PIPELINE_PATCH = "no async-MoE pipeline patch is installed in this process"


def attach_recorder(connector, recorder) -> None:
    """Give the runner's connector its session's recorder (None: count nothing)."""
    vars(connector)[EXPERT_LOAD_ATTRIBUTE] = recorder


@dataclass(frozen=True)
class PluginSeams:
    """The upstream objects the hook patches (modules of the installed plugin, or stand-ins)."""

    runner_module: ModuleType
    runner_class: type
    slice_type: type
    ensure_forward: Callable[[], None] | None = None
    """Makes sure the async-MoE pipeline is the patched one before relaid PCP stages are
    planned (``install``; raises ``PluginDriftError`` when it cannot be); None: PCP stages
    are refused."""
    drifted: Callable[[], tuple[str, ...]] | None = None
    """Why token_balanced is refused after a seam drifted (``drift_guard.DriftLog.reasons``,
    read when a step is planned); None: no import hook watches the seams."""


def seams_of(runner_module: ModuleType) -> PluginSeams:
    """The seams around a loaded runner module (whose own imports loaded the rest)."""
    from vllm.v1.worker.ubatch_utils import UBatchSlice

    return PluginSeams(runner_module=runner_module, runner_class=vars(runner_module)[RUNNER_CLASS],
                       slice_type=UBatchSlice)


def plugin_request_split() -> str:
    """afd_plugin's own request-boundary split value, read when the validator first runs
    (in a worker: its connector module is loaded by then, never at registration)."""
    from afd_plugin.connectors.npu.async_cam import ASYNC_MOE_REQUEST_SPLIT

    return ASYNC_MOE_REQUEST_SPLIT


def runner_session(runner, new_session: Callable[[Any], HookSession]) -> HookSession:
    """The runner's ``HookSession``, created on its first token_balanced step."""
    session = vars(runner).get(SESSION_ATTRIBUTE)
    if session is None:
        session = new_session(runner)
        vars(runner)[SESSION_ATTRIBUTE] = session
        attach_recorder(runner.connector, session.expert_load)
    return session


def ensure_forward(seams: PluginSeams) -> Callable[[], None]:
    """``seams.ensure_forward``, or a refusal of relaid PCP stages where nothing installs the
    pipeline patch."""
    if seams.ensure_forward is not None:
        return seams.ensure_forward

    def refuse() -> None:
        raise drift_refusal((NO_PIPELINE_PATCH,))

    return refuse


def plan_runner_stages(runner, num_scheduled_tokens_np: np.ndarray, seams: PluginSeams,
                       new_session: Callable[[Any], HookSession],
                       num_tokens_padded: int | None = None) -> PlannedUBatchSlices | None:
    """Plan from the host arrays the pinned runner already holds (no device reads). Below
    the session's split threshold with nothing recording, nothing else is read."""
    num_reqs = len(num_scheduled_tokens_np)
    session = runner_session(runner, new_session)
    if pcp_enabled(session.alignment.pcp_size):
        return plan_pcp_runner_stages(runner, session, num_reqs, seams.slice_type,
                                      ensure_forward(seams))
    if session.skips_step(num_scheduled_tokens_np):
        return None
    computed = runner_computed_tokens(runner, num_reqs)
    return plan_stages(
        session,
        num_scheduled_tokens_np,
        num_computed_tokens=computed,
        block_size=runner.cache_config.block_size,
        slice_type=seams.slice_type,
        num_input_tokens=num_tokens_padded,
        # The facts go only into the step line: not gathered when no evidence is written.
        step_facts=(runner_step_facts(runner, num_scheduled_tokens_np, computed)
                    if session.writer is not None else None),
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
        raise drift_refusal(drift_reasons)
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
    pcp_size = stage_slices.pcp.relayout.pcp_size if stage_slices.pcp is not None else 1
    bound = stage_write_bound(num_scheduled_tokens_np, num_tokens, num_tokens_padded, pcp_size)
    with preserved_state((runner, RUNNER_STATE_KEPT_ACROSS_STAGE_BUILD),
                         *builder_state_targets(builders, buffers, bound)):
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


RUNNER_NOT_LOADED = "the afd-plugin runner module is not loaded, so no per-stage PCP rebuild was checked"


def runner_pcp_unavailable(runner_module: ModuleType | None) -> str | None:
    """Why PCP cannot run with this runner module (None: the pinned release seam is there);
    the planner's pinned header names the branch, patched or not (the patch keeps it)."""
    if runner_module is None:
        return RUNNER_NOT_LOADED
    runner_class = vars(runner_module)[RUNNER_CLASS]
    return pcp_seam_unavailable(runner_class,
                                installed_branch(PLANNER, vars(runner_class)[PLANNER_NAME]))
