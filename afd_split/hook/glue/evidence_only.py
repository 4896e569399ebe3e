"""Evidence-only glue: the step line for a ``none`` or ``request`` deployment's step.

The plugin's own planner decides (its request-boundary split, or no ubatching for
``none``); after the runner's metadata router returns, ``patches.router`` calls
``observe``, which reads what the plugin decided (``_afd_async_moe_ubatch_metadata`` /
``ubatch_slices``) and writes the same step line ``token_balanced`` writes
(``observed_plan``), then begins the step's expert-load count. Nothing the plugin reads
is written. A step it cannot describe gets an ``afd_step_unrecorded`` line with the
reason, and a failure here never reaches the forward: it is logged once and the runner
stops recording. Kept apart from the patch file so the patch holds only the pinned
wrapper (AGENTS.md: one patch file per upstream target).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from afd_split.hook.facts.drift_guard import TOKEN_BALANCED_SPLIT
from afd_split.hook.glue.builder_state import PCP_PADDED_SLOT_BUFFERS, fields_viewing
from afd_split.hook.glue.runner import attach_recorder
from afd_split.hook.glue.step_facts import runner_step_facts
from afd_split.hook.planning.engine_step import step_record
from afd_split.hook.planning.observed_plan import observed_plan
from afd_split.hook.planning.stages import SESSION_ATTRIBUTE, HookSession
from afd_split.hook.planning.worker_evidence import (
    EVIDENCE_DIR_ENV,
    EVIDENCE_FORMAT,
    UNRECORDED_KIND,
)
from afd_split.plan.constraints import SplitPolicy

logger = logging.getLogger(__name__)

DISABLED_ATTRIBUTE = "_afd_split_evidence_only_disabled"
"""AFD-only runner attribute: why this runner stopped recording (its first failure)."""

NO_UBATCHING = "none"
"""The harness's name for a deployment without ``async_moe_ubatching``."""

PLANNER_LABEL = "afd_plugin"
"""``planner`` of an evidence-only step line: the plugin decided, afd_split only recorded."""

PLUGIN_DID_NOT_SPLIT = ("the plugin's request-boundary search returned no split "
                        "(fewer than two requests or tokens)")
GATE_NOT_ON_ATTENTION = ("compute_gate_on_attention is off: the routed top-k ids never reach "
                         "the Attention side's dispatch")


def evidence_session(runner, new_session: Callable[[Any], HookSession]) -> HookSession:
    """The runner's ``HookSession`` (one per runner, shared with token_balanced), its
    expert-load recorder attached to the connector only where top-k ids are dispatched."""
    session = vars(runner).get(SESSION_ATTRIBUTE)
    if session is None:
        session = new_session(runner)
        if not getattr(runner.afd_config, "compute_gate_on_attention", False):
            session.expert_load = None
        vars(runner)[SESSION_ATTRIBUTE] = session
        attach_recorder(runner.connector, session.expert_load)
    return session


FULL_BATCH_CONTAMINATED = "full_batch_contaminated"
"""Step-line key: the full batch's fields the plugin's own stage build overwrote."""


def upstream_contamination(runner, stages, full_result) -> dict | None:
    """The plugin's own split under PCP (release/v0.19.1rc1 2f4f462) rebuilds each stage's
    padded slots in ``PCPManager.pcp_padded_slot_mapping_list[gid]``, which keeps the last
    stage's; a full batch (the router's per-layer metadata) whose fields view that buffer
    (MLA-CP / attention-CP) has lost its slots (docs/ascend.md). None when not so."""
    manager = getattr(runner, "pcp_manager", None)
    if (stages is None or manager is None or not getattr(runner, "use_cp", False)
            or not isinstance(full_result, tuple) or not full_result):
        return None
    buffers = list(getattr(manager, PCP_PADDED_SLOT_BUFFERS, None) or ())
    fields = fields_viewing(full_result[0], buffers)
    if not fields:
        return None
    return {"fields": fields, "buffer": f"PCPManager.{PCP_PADDED_SLOT_BUFFERS}",
            "by": "the plugin's per-stage PCP rebuild (get_padded_slot_mapping), which "
                  "leaves the last stage's padded slots there",
            "effect": "the dense layers write the full batch's KV with the last stage's slots"}


def plugin_stages(runner, split: str, request_split: str):
    """(policy, the plugin's (request_slice, token_slice) stages or None, unsplit reason)."""
    if split == NO_UBATCHING:
        if runner.ubatch_slices is not None:  # native DBO, refused with the CAM connector
            raise ValueError("a native DBO ubatch split is not a recorded policy")
        return SplitPolicy.NONE, None, None
    if split != request_split:
        raise ValueError(f"async_moe_split={split!r} has no afd_split policy to record it as")
    metadata = runner._afd_async_moe_ubatch_metadata
    if metadata is None:
        return SplitPolicy.REQUEST_BOUNDARY, None, PLUGIN_DID_NOT_SPLIT
    stages = [(s.request_slice, s.token_slice) for s in metadata["ubatch_slices"]]
    return SplitPolicy.REQUEST_BOUNDARY, stages, None


def record_plugin_step(runner, session: HookSession, values: Mapping[str, Any], split: str,
                       request_split: str, full_result=None) -> None:
    """One step line describing the plugin's own decision (or an unrecorded line naming why
    it could not be described), then the step's expert-load count begins. A full batch
    the plugin's own stage build overwrote is marked (``FULL_BATCH_CONTAMINATED``)."""
    step = session.steps_planned
    session.steps_planned += 1
    num_rows = values.get("num_tokens_padded")
    num_rows = None if num_rows is None else int(num_rows)
    try:
        policy, stages, reason = plugin_stages(runner, split, request_split)
        plan = observed_plan(values["num_scheduled_tokens_np"], stages, policy=policy,
                             num_input_rows=num_rows, unsplit_reason=reason)
    except ValueError as error:
        session.writer.append({"kind": UNRECORDED_KIND, "format": EVIDENCE_FORMAT, "step": step,
                               "ranks": session.ranks.to_dict(), "split": split,
                               "reason": str(error)})
        return
    contaminated = upstream_contamination(runner, stages, full_result)
    facts = runner_step_facts(runner, values["num_scheduled_tokens_np"])
    session.writer.append(step_record(
        plan, step=step, ranks=session.ranks, pid=os.getpid(), planner=PLANNER_LABEL,
        alignment=session.alignment.describe(), parent_rows=num_rows, **facts,
        **({} if contaminated is None else {FULL_BATCH_CONTAMINATED: contaminated}),
        **({} if session.expert_load is not None
           else {"expert_load_absent_reason": GATE_NOT_ON_ATTENTION})))
    if session.expert_load is not None:
        session.expert_load.begin_step(step, len(plan.ubatches))


def observe(runner, values: Mapping[str, Any], new_session: Callable[[Any], HookSession],
            request_split: Callable[[], str], environ: Mapping[str, str] = os.environ,
            full_result=None) -> None:
    """After the plugin's router: record its decision when evidence is on (never raises)."""
    extra = runner.afd_async_extra_info
    split = extra.async_moe_split if extra.async_moe_ubatching else NO_UBATCHING
    if (split == TOKEN_BALANCED_SPLIT or values.get("num_scheduled_tokens_np") is None
            or not environ.get(EVIDENCE_DIR_ENV) or DISABLED_ATTRIBUTE in vars(runner)):
        return  # token_balanced: the planner patch records; no host counts: nothing planned
    try:
        session = evidence_session(runner, new_session)
        if session.writer is not None:
            record_plugin_step(runner, session, values, split, request_split(), full_result)
    except Exception as error:  # evidence must never fail the plugin's forward
        vars(runner)[DISABLED_ATTRIBUTE] = repr(error)
        logger.exception("afd_split evidence-only recording stopped on this runner")
