"""vLLM general plugin: ``async_moe_split="token_balanced"`` for the AFD plugin's async MoE.

Entry point (pyproject ``[project.entry-points."vllm.general_plugins"]``):
``afd_split = "afd_split.integrations.afd_plugin:register"``. vLLM calls it in
every process (possibly more than once), in the API server before vLLM-Ascend
has set up: it imports nothing of the plugin's NPU stack and patches each seam
module when it loads (``deferred``). Without afd_plugin it does nothing,
and a process where the hook is not installed still refuses
``token_balanced`` through the plugin's own validator, so the value can never
run unplanned. Enable per deployment with
``connector_extra_config.async_moe_split="token_balanced"`` and add
``afd_split`` to ``VLLM_PLUGINS`` where that list is set.
"""

from __future__ import annotations

import importlib.util
import logging
import os

from afd_split.integrations.afd_plugin.stages import (
    TOKEN_BALANCED_SPLIT,
    HookSession,
    ascend_splitter,
)
from afd_split.integrations.engine_step import StepRanks
from afd_split.integrations.expert_load import routing_label

PLUGIN_NAME = "afd_split"
"""Entry-point name (what ``VLLM_PLUGINS`` lists)."""

MIN_GROUP_SIZE_TO_AGREE = 2

logger = logging.getLogger(__name__)


def engine_session(runner) -> HookSession:
    """The runner's hook session from vLLM's existing TP and PCP groups (imports vLLM)."""
    import torch.distributed as dist
    from vllm.distributed import get_tp_group
    from vllm.distributed.parallel_state import get_pcp_group

    from afd_split.integrations.afd_plugin.rules import runner_alignment

    parallel = runner.vllm_config.parallel_config
    tp_group = get_tp_group()
    groups = [tp_group.cpu_group] if tp_group.world_size >= MIN_GROUP_SIZE_TO_AGREE else []
    pcp_rank, pcp_all_to_all = 0, None
    if parallel.prefill_context_parallel_size >= MIN_GROUP_SIZE_TO_AGREE:
        from afd_split.integrations.afd_plugin.pcp_seam import group_all_to_all

        pcp_group = get_pcp_group()
        groups.append(pcp_group.cpu_group)
        pcp_rank = pcp_group.rank_in_group
        pcp_all_to_all = group_all_to_all(pcp_group.device_group)

    ranks = StepRanks(global_rank=dist.get_rank(), dp_rank=parallel.data_parallel_rank,
                      tp_rank=tp_group.rank_in_group, pcp_rank=pcp_rank)
    chunked_prefill = runner.scheduler_config.enable_chunked_prefill
    return HookSession.from_environment(os.environ, ranks=ranks, groups=groups,
                                        splitter=ascend_splitter(chunked_prefill=chunked_prefill),
                                        alignment=runner_alignment(runner.vllm_config),
                                        num_layers=runner.vllm_config.model_config
                                        .hf_text_config.num_hidden_layers,
                                        routing=engine_routing(runner.vllm_config),
                                        pcp_all_to_all=pcp_all_to_all,
                                        chunked_prefill=chunked_prefill)


def engine_routing(vllm_config) -> str:
    """How the ids the dispatch seam counts are routed: forced-balanced only when the switch
    of the dispatched path is on. Token-balanced runs with the gate on Attention (the
    validator requires it), where afd_plugin's ``AFD_FORCE_BALANCED_TOPK_IDS`` rewrites the
    ids and ``enable_force_load_balance`` (FFN-side W8A8 expert selection) does not
    (``expert_load.routing_label``)."""
    from afd_plugin.envs import force_balanced_topk_ids_enabled

    additional = vllm_config.additional_config or {}
    afd = additional.get("afd") or {}
    return routing_label(
        force_balanced_env=force_balanced_topk_ids_enabled(),
        force_load_balance_config=bool(additional.get("enable_force_load_balance", False)),
        gate_on_attention=bool(afd.get("compute_gate_on_attention", True)),
    )


def register() -> None:
    """``vllm.general_plugins`` entry point: install the hook where afd_plugin is installed.

    Imports nothing of afd_plugin, vLLM-Ascend or torch_npu (``deferred``): each seam
    module is patched when it is already loaded, else right after it first loads.
    """
    if importlib.util.find_spec("afd_plugin") is None:
        logger.debug("%s: afd_plugin is not installed; nothing to patch", PLUGIN_NAME)
        return
    from afd_split.integrations.afd_plugin.deferred import install_deferred

    install_deferred(new_session=engine_session)
    logger.info("%s: async_moe_split=%r will be routed through afd_split when afd_plugin's "
                "seam modules load", PLUGIN_NAME, TOKEN_BALANCED_SPLIT)


__all__ = ["PLUGIN_NAME", "TOKEN_BALANCED_SPLIT", "engine_routing", "engine_session", "register"]
