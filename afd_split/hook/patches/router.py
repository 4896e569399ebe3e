"""Evidence-only mode: step and expert-load evidence for ``none`` and ``request`` deployments.

Written to the AFD plugin's AGENTS.md rules like every patch file: the pinned header
exactly (``pinned.ROUTER``), the reason and behaviour in the comment above, the
AFD-split-only delta between ``# ### PATCH START/END``, the whole upstream body
run through the ORIGINAL function object first, and its result returned as is.

The mode is what the hook does for every deployment whose ``async_moe_split`` is
not ``token_balanced``, once ``afd_split`` is in ``VLLM_PLUGINS`` (the launch plans
add it on the Attention processes of ``none`` and ``request`` deployments) and
``AFD_EVIDENCE_DIR`` is set. The plugin's own planner decides (its request-boundary
split, or no ubatching for ``none``); after the runner's metadata router returns,
the hook reads what the plugin decided (``_afd_async_moe_ubatch_metadata`` /
``ubatch_slices``) and writes the same step line ``token_balanced`` writes
(``observed_plan``), and begins the step's expert-load count at the CAM dispatch
(``patches.dispatch``). Nothing the plugin reads is written, so ``request`` and
``none`` run exactly as the plugin alone; where the plugin's own PCP stage build left
the full batch's slots viewing a buffer it overwrote (release/v0.19.1rc1, MLA-CP), the
step line says so (``full_batch_contaminated``; docs/ascend.md). A step it cannot describe gets an
``afd_step_unrecorded`` line with the reason (the case's steps are then absent,
named), and a failure of the evidence code never reaches the forward: it is
logged once and the runner stops recording.

Drift: a router whose header matches no pinned variant is left unpatched
(logged; the cases then have no step lines, so their evidence is absent).

Removal plan (docs/ascend.md): with an upstream per-step observer on the runner
(or the planner registry of ``patches.planner``), this seam is dropped.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from afd_split.hook.facts.drift_guard import (
    PATCH_MARKER,
    TOKEN_BALANCED_SPLIT,
    PluginDriftError,
    installed_branch,
)
from afd_split.hook.facts.pinned import MAIN, ROUTER, ROUTER_NAME, RUNNER_CLASS
from afd_split.hook.glue.builder_state import PCP_PADDED_SLOT_BUFFERS, fields_viewing
from afd_split.hook.glue.layer_ranges import ensure_runner_ranges
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

if TYPE_CHECKING:  # names of the pinned headers; never imported at run time
    import numpy as np
    import torch
    from vllm.v1.attention.backends.utils import CommonAttentionMetadata
    from vllm.v1.worker.ubatch_utils import UBatchSlices
    from vllm_ascend.worker.model_runner_v1 import PerLayerAttnMetadata

logger = logging.getLogger(__name__)

VALUES_HELPER = "_attention_metadata_values"
"""release/v0.19.1rc1's own (args, kwargs) -> named values helper of the router."""

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


def make_router_patch_main(original: Callable, new_session: Callable[[Any], HookSession],
                           request_split: Callable[[], str]) -> Callable:
    # Upstream source: afd-plugin main 2e4378f, v1/worker/npu/attention_model_runner.py
    # AFDNPUAttentionModelRunner._build_attention_metadata.
    # Patch reason: the plugin's request and unsplit paths leave no record of the tokens
    # each stage ran, so the controls of a policy comparison had no step evidence.
    # Patch functionality: after the original returns, its decision (the async-MoE stage
    # slices, or none) is written as a step line and the step's expert-load count begins;
    # with the plugin's Attention profiler on, the model's layer/stage range hooks are
    # installed once (``layer_ranges``; every async_moe_split value, token_balanced too).
    # Delegation exception: the whole upstream body runs through the original first, and
    # its result is returned unchanged; token_balanced is recorded by the planner patch.
    # Signature: matches upstream; no added parameters.
    def _build_attention_metadata(self, num_tokens: int, num_reqs: int, max_query_len: int, num_tokens_padded: int | None = None, num_reqs_padded: int | None = None, ubatch_slices: UBatchSlices | None = None, logits_indices: torch.Tensor | None = None, use_spec_decode: bool = False, for_cudagraph_capture: bool = False, num_scheduled_tokens: dict[str, int] | None = None, num_scheduled_tokens_np: np.ndarray | None = None, cascade_attn_prefix_lens: list[list[int]] | None = None) -> tuple[PerLayerAttnMetadata, CommonAttentionMetadata | None]:
        result = original(
            self, num_tokens=num_tokens, num_reqs=num_reqs, max_query_len=max_query_len,
            num_tokens_padded=num_tokens_padded, num_reqs_padded=num_reqs_padded,
            ubatch_slices=ubatch_slices, logits_indices=logits_indices,
            use_spec_decode=use_spec_decode, for_cudagraph_capture=for_cudagraph_capture,
            num_scheduled_tokens=num_scheduled_tokens,
            num_scheduled_tokens_np=num_scheduled_tokens_np,
            cascade_attn_prefix_lens=cascade_attn_prefix_lens,
        )
        # ### PATCH START: afd_split evidence-only step record, profiler ranges
        observe(self, {"num_tokens_padded": num_tokens_padded,
                       "num_scheduled_tokens_np": num_scheduled_tokens_np},
                new_session, request_split, full_result=result)
        ensure_runner_ranges(self)
        # ### PATCH END: afd_split evidence-only step record, profiler ranges
        return result

    setattr(_build_attention_metadata, PATCH_MARKER, ROUTER)
    return _build_attention_metadata


def make_router_patch_release(original: Callable, values_of: Callable,
                              new_session: Callable[[Any], HookSession],
                              request_split: Callable[[], str]) -> Callable:
    # Upstream source: afd-plugin release/v0.19.1rc1 2f4f462, same method as on main; on
    # this branch it takes (*args, **kwargs) and names them with the module's own
    # _attention_metadata_values.
    # Patch reason and functionality: as make_router_patch_main.
    # Delegation exception: the whole upstream body runs through the original first.
    # Signature: matches upstream; no added parameters.
    def _build_attention_metadata(self, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        # ### PATCH START: afd_split evidence-only step record, profiler ranges
        observe(self, values_of(args, kwargs), new_session, request_split, full_result=result)
        ensure_runner_ranges(self)
        # ### PATCH END: afd_split evidence-only step record, profiler ranges
        return result

    setattr(_build_attention_metadata, PATCH_MARKER, ROUTER)
    return _build_attention_metadata


def install_evidence_only(runner_module: ModuleType, new_session: Callable[[Any], HookSession],
                          request_split: Callable[[], str]) -> str:
    """Wrap the runner's router (drift-checked, idempotent). Never raises on drift: the
    module stays unpatched, logged, and returns ``"drifted"``; else the branch or
    ``"already-installed"``."""
    runner_class = vars(runner_module)[RUNNER_CLASS]
    router = vars(runner_class).get(ROUTER_NAME)
    if getattr(router, PATCH_MARKER, None) == ROUTER:
        return "already-installed"
    try:
        if router is None:
            raise PluginDriftError(f"{RUNNER_CLASS}.{ROUTER_NAME} is not defined on the runner")
        branch = installed_branch(ROUTER, router)
        if branch == MAIN[0]:
            patched = make_router_patch_main(router, new_session, request_split)
        else:
            values_of = vars(runner_module).get(VALUES_HELPER)
            if values_of is None:
                raise PluginDriftError(f"{runner_module.__name__}.{VALUES_HELPER} is missing")
            patched = make_router_patch_release(router, values_of, new_session, request_split)
    except PluginDriftError as error:
        logger.warning("afd_split evidence-only mode is off (the runner stays the plugin's "
                       "own): %s", error)
        return "drifted"
    setattr(runner_class, ROUTER_NAME, patched)
    return branch
