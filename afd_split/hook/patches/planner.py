"""The planner patch: ``token_balanced`` async-MoE stages planned by afd_split.

Written to the AFD plugin's AGENTS.md rules: the patch function carries the pinned
upstream header exactly (``facts.pinned``), has its reason and behaviour in the
comment right above it, and marks every AFD-split-only delta with
``# ### PATCH START/END``. Every value of ``async_moe_split`` other than
``token_balanced`` delegates to the ORIGINAL function object, so the plugin runs
byte-for-byte unchanged (this project reads upstream for facts and does not copy its
code). The factory closes over the original; nothing is stored in a module global.

Removal plan (docs/ascend.md): upstream an ``async_moe_split`` planner registry to
afd-plugin (plan function + metadata splitter per value); then this seam stops being
patched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from afd_split.hook.facts.drift_guard import PATCH_MARKER, TOKEN_BALANCED_SPLIT
from afd_split.hook.facts.pinned import PLANNER, RELEASE_V0_19_1RC1
from afd_split.hook.glue.runner import PluginSeams, build_token_balanced_stages
from afd_split.hook.planning.stages import HookSession

if TYPE_CHECKING:  # names of the pinned headers; never imported at run time
    import numpy as np
    import torch
    from vllm.v1.attention.backends.utils import CommonAttentionMetadata
    from vllm.v1.worker.ubatch_utils import UBatchSlices
    from vllm_ascend.worker.model_runner_v1 import PerLayerAttnMetadata


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
