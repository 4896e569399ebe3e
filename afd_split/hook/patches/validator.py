"""The validator patch: ``token_balanced`` judged by the plugin's checks plus afd_split's rules.

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
from types import ModuleType
from typing import TYPE_CHECKING

from afd_split.hook.facts.drift_guard import (
    PATCH_MARKER,
    TOKEN_BALANCED_SPLIT,
    installed_branch,
)
from afd_split.hook.facts.pinned import VALIDATOR, VALIDATOR_NAME
from afd_split.hook.planning.rules import NO_PCP_SEAM, token_balanced_unsupported_reasons

if TYPE_CHECKING:  # names of the pinned header; never imported at run time
    from afd_plugin.config import AFDConfig
    from vllm.config import VllmConfig


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
