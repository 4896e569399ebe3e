"""Evidence-only mode: step and expert-load evidence for ``none`` and ``request`` deployments.

Written to the AFD plugin's AGENTS.md rules like every patch file: the pinned header
exactly (``pinned.ROUTER``), the reason and behaviour in the comment above, the
AFD-split-only delta between ``# ### PATCH START/END``, the whole upstream body
run through the ORIGINAL function object first, and its result returned as is.

The recording itself is glue (``glue.evidence_only``); this file holds the pinned
wrappers only. The mode is what the hook does for every deployment whose ``async_moe_split`` is
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
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from afd_split.hook.facts.drift_guard import PATCH_MARKER, PluginDriftError, installed_branch
from afd_split.hook.facts.pinned import MAIN, ROUTER, ROUTER_NAME, RUNNER_CLASS
from afd_split.hook.glue.evidence_only import observe
from afd_split.hook.glue.layer_ranges import ensure_runner_ranges
from afd_split.hook.planning.stages import HookSession

if TYPE_CHECKING:  # names of the pinned headers; never imported at run time
    import numpy as np
    import torch
    from vllm.v1.attention.backends.utils import CommonAttentionMetadata
    from vllm.v1.worker.ubatch_utils import UBatchSlices
    from vllm_ascend.worker.model_runner_v1 import PerLayerAttnMetadata

logger = logging.getLogger(__name__)

VALUES_HELPER = "_attention_metadata_values"
"""release/v0.19.1rc1's own (args, kwargs) -> named values helper of the router."""


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
