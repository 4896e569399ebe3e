"""Which deployments may run ``async_moe_split="token_balanced"`` (the validator patch's rules).

afd_split's support rules (``afd_split.checks.support``), the stage alignment of the
engine's TP/SP/PCP path, and PCP: accepted only where the installed plugin has
the per-stage PCP rebuild (release/v0.19.1rc1) and on the path that is modelled
(DCP 1, no speculative decoding, no hybrid attention).
"""

from __future__ import annotations

from afd_split.checks.support import SplitSupportConfig, unsupported_reasons
from afd_split.engine.ascend import check_ascend_pcp_startup
from afd_split.errors import UnsupportedSplitError
from afd_split.hook.facts.drift_guard import TOKEN_BALANCED_SPLIT
from afd_split.hook.facts.pcp_drift import PCP_SEAM_BRANCH
from afd_split.pcp.alignment import EngineAlignment
from afd_split.pcp.stage import check_pcp_stage_support
from afd_split.plan.constraints import MIN_PCP_FOR_ZIGZAG

SPARSE_ATTENTION_CONFIG_KEY = "index_topk"
"""HF text-config key of DeepSeek V3.2 sparse attention (the plugin's own SFA test)."""

SFA_BUILDER = "AscendSFAMetadataBuilder"
MLA_BUILDER = "AscendMLAMetadataBuilder"

HYBRID_ATTENTION_MODEL_TYPE = "qwen3_next"
"""``PCPManager.pcp_use_hybrid_attn`` at vllm-ascend v0.19.1rc1 (hf_config.model_type)."""

PCP_REJECTION = "prefill_context_parallel_size={pcp} > 1: {why}"

NO_PCP_SEAM = f"no afd-plugin per-stage PCP rebuild was checked ({PCP_SEAM_BRANCH} has one)"
"""Default: PCP is refused unless ``install`` found the pinned release seam."""


def pcp_enabled(pcp_size: int) -> bool:
    """PCP stages are planned (a PCP group of at least two ranks)."""
    return pcp_size >= MIN_PCP_FOR_ZIGZAG


def runner_alignment(vllm_config) -> EngineAlignment:
    """The stage alignment of this deployment: TP, vLLM-Ascend's SP switches, PCP (imports
    vllm_ascend; ``enable_sp`` / ``enable_sp_by_pass`` are what ``_pad_for_sequence_parallelism``
    reads)."""
    from vllm_ascend.utils import enable_sp, enable_sp_by_pass

    parallel = vllm_config.parallel_config
    return EngineAlignment(tp_size=parallel.tensor_parallel_size,
                           sequence_parallel=bool(enable_sp(vllm_config) or enable_sp_by_pass()),
                           pcp_size=parallel.prefill_context_parallel_size)


def pcp_unsupported_reasons(vllm_config, pcp_unavailable: str | None) -> list[str]:
    """Why PCP may not run ``token_balanced`` here: the installed seam (``pcp_unavailable``,
    from ``pcp_seam.pcp_seam_unavailable``) and the modelled path."""
    parallel = vllm_config.parallel_config
    pcp = parallel.prefill_context_parallel_size
    if not pcp_enabled(pcp):
        return []
    if pcp_unavailable is not None:
        return [PCP_REJECTION.format(pcp=pcp, why=pcp_unavailable)]
    speculative = vllm_config.speculative_config
    try:
        check_pcp_stage_support(
            pcp_size=pcp, dcp_size=parallel.decode_context_parallel_size,
            num_speculative_tokens=0 if speculative is None else speculative.num_speculative_tokens,
            hybrid_attention=vllm_config.model_config.hf_config.model_type
            == HYBRID_ATTENTION_MODEL_TYPE)
    except UnsupportedSplitError as error:
        return [str(error)]
    return []


def token_balanced_unsupported_reasons(vllm_config, afd_config, num_ubatches: int,
                                       pcp_unavailable: str | None = NO_PCP_SEAM) -> list[str]:
    """Why this deployment may not run ``token_balanced`` (afd_split's support rules + PCP)."""
    parallel = vllm_config.parallel_config
    model = vllm_config.model_config
    speculative = vllm_config.speculative_config
    sparse = SPARSE_ATTENTION_CONFIG_KEY in model.hf_text_config.to_dict()
    reasons = unsupported_reasons(SplitSupportConfig(
        attention_builder=SFA_BUILDER if sparse else MLA_BUILDER,
        split_policy=TOKEN_BALANCED_SPLIT,
        num_stages=num_ubatches,
        graph_mode="eager" if model.enforce_eager else "graph",
        num_speculative_tokens=0 if speculative is None else speculative.num_speculative_tokens,
        dcp_size=parallel.decode_context_parallel_size,
        pcp_size=parallel.prefill_context_parallel_size,
        tp_size=parallel.tensor_parallel_size,
        compute_gate_on_attention=afd_config.compute_gate_on_attention,
        native_dbo=parallel.enable_dbo,
    ))
    if pcp_enabled(parallel.prefill_context_parallel_size):
        # PCP stages are built by afd_split.engine.ascend_pcp with the plugin's own
        # stage-PCP rebuild (pcp_seam), not the adapter's PCP builder hook, so the
        # adapter's start-up check does not apply.
        return reasons + pcp_unsupported_reasons(vllm_config, pcp_unavailable)
    check_ascend_pcp_startup(pcp_size=parallel.prefill_context_parallel_size,
                             pcp_stage_builder=None)
    return reasons
