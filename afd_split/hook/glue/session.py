"""The runner's ``HookSession`` from the engine's own groups and config (imports vLLM lazily)."""

from __future__ import annotations

import os

from afd_split.hook.planning.engine_step import StepRanks
from afd_split.hook.planning.expert_load import routing_label
from afd_split.hook.planning.stages import HookSession, ascend_splitter

MIN_GROUP_SIZE_TO_AGREE = 2


def engine_session(runner) -> HookSession:
    """The runner's hook session from vLLM's existing TP and PCP groups (imports vLLM)."""
    import torch.distributed as dist
    from vllm.distributed import get_tp_group
    from vllm.distributed.parallel_state import get_pcp_group

    from afd_split.hook.planning.rules import runner_alignment

    parallel = runner.vllm_config.parallel_config
    tp_group = get_tp_group()
    groups = [tp_group.cpu_group] if tp_group.world_size >= MIN_GROUP_SIZE_TO_AGREE else []
    pcp_rank, pcp_all_to_all = 0, None
    if parallel.prefill_context_parallel_size >= MIN_GROUP_SIZE_TO_AGREE:
        from afd_split.hook.glue.pcp_seam import group_all_to_all

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


__all__ = ["engine_routing", "engine_session"]
