"""Fail-closed validation of a deployment before it may split batches.

Everything here is a pure check over a small config, so it runs before any
process group, communicator or device buffer exists: an unsupported
combination must never get as far as a half-initialised collective.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from afd_split.errors import UnsupportedSplitError
from afd_split.plan.constraints import SplitPolicy

CPU_REFERENCE_BUILDER = "CPUReferenceAttentionBuilder"
"""The harness's CPU reference attention (pytest_afd CPU backend)."""

TOKEN_SPLIT_ATTENTION_BUILDERS = frozenset({"AscendSFAMetadataBuilder", CPU_REFERENCE_BUILDER})
"""Builders whose metadata this package can slice inside a request (DeepSeek V3.2 sparse MLA)."""

REQUEST_SPLIT_ATTENTION_BUILDERS = TOKEN_SPLIT_ATTENTION_BUILDERS | {"AscendMLAMetadataBuilder"}
"""Builders that may run the request-boundary control split."""

SUPPORTED_GRAPH_MODES = frozenset({"eager"})
"""CAM async MoE staging rejects captured graphs."""

SUPPORTED_NUM_STAGES = 2
"""The RFC supports exactly two ubatches."""

MAX_SUPPORTED_DCP_SIZE = 1
"""Decode context parallelism changes seq_len ownership per rank; not sliced here."""

T = TypeVar("T")


@dataclass(frozen=True)
class SplitSupportConfig:
    """The deployment facts that decide whether a split may run at all."""

    attention_builder: str
    split_policy: SplitPolicy | str = SplitPolicy.TOKEN_BALANCED
    num_stages: int = SUPPORTED_NUM_STAGES
    graph_mode: str = "eager"
    num_speculative_tokens: int = 0
    dcp_size: int = 1
    pcp_size: int = 1
    tp_size: int = 1
    compute_gate_on_attention: bool = True
    native_dbo: bool = False


def unsupported_reasons(config: SplitSupportConfig) -> list[str]:
    """Every reason ``config`` may not split; empty when it is supported."""
    try:
        policy = SplitPolicy(config.split_policy)
    except ValueError:
        known = [member.value for member in SplitPolicy]
        return [f"unknown split policy {config.split_policy!r} (known: {known})"]
    if policy is SplitPolicy.NONE:
        return []
    reasons = []
    builders = (
        TOKEN_SPLIT_ATTENTION_BUILDERS
        if policy is SplitPolicy.TOKEN_BALANCED
        else REQUEST_SPLIT_ATTENTION_BUILDERS
    )
    if config.attention_builder not in builders:
        reasons.append(
            f"attention builder {config.attention_builder!r} is not supported for "
            f"{policy.value} (supported: {sorted(builders)})"
        )
    if config.graph_mode not in SUPPORTED_GRAPH_MODES:
        reasons.append(
            f"graph mode {config.graph_mode!r} is not supported (supported: "
            f"{sorted(SUPPORTED_GRAPH_MODES)})"
        )
    if config.num_stages != SUPPORTED_NUM_STAGES:
        reasons.append(f"num_stages={config.num_stages}; exactly {SUPPORTED_NUM_STAGES} supported")
    if config.num_speculative_tokens:
        reasons.append(
            f"speculative metadata (num_speculative_tokens={config.num_speculative_tokens}) "
            "cannot be split"
        )
    if config.dcp_size > MAX_SUPPORTED_DCP_SIZE:
        reasons.append(f"dcp_size={config.dcp_size} > {MAX_SUPPORTED_DCP_SIZE} is not supported")
    if config.pcp_size < 1 or config.tp_size < 1:
        reasons.append(f"invalid topology pcp_size={config.pcp_size}, tp_size={config.tp_size}")
    if not config.compute_gate_on_attention:
        reasons.append("the MoE gate must run on the attention side (compute_gate_on_attention)")
    if config.native_dbo:
        reasons.append("vLLM native DBO flags conflict with AFD-managed async MoE ubatching")
    return reasons


def validate_split_support(config: SplitSupportConfig) -> None:
    """Raise ``UnsupportedSplitError`` naming every unsupported feature of ``config``."""
    reasons = unsupported_reasons(config)
    if reasons:
        raise UnsupportedSplitError("split path unsupported: " + "; ".join(reasons))


def prepare_split_runtime(config: SplitSupportConfig, init_group: Callable[[], T]) -> T:
    """Validate first, then create process groups / communicators via ``init_group``.

    The order is the contract: a rejected config returns before ``init_group``
    runs, so no collective resource is ever created for it.
    """
    validate_split_support(config)
    return init_group()
