"""The sixth patch: token_balanced refused naming a drifted seam, where the config is parsed.

When a seam's module drifted, the import hook leaves it as the plugin built it
(``drift_guard``). If that module is the validator's own, the plugin's validator
refuses ``token_balanced`` with its own message ("supports only request-boundary
split"), which does not say why afd_split is not there. afd-plugin parses the
connector's extra config (``CAMAsyncAFDConnector.parse_extra_config``, in the
connector module, not the validation module) before its validator judges the value
(``fail_if_unsupported_npu_afd_features`` at main 2e4378f and release/v0.19.1rc1
2f4f462; also in ``AFDConnectorBase.__init__``), so this seam refuses an async-MoE
``token_balanced`` config first, naming every seam left unpatched.

Written to the AFD plugin's AGENTS.md rules like every patch file: the pinned header
exactly (``pinned.EXTRA_INFO``), the reason and behaviour in the comment above, the
AFD-split-only delta between ``# ### PATCH START/END``, and the whole upstream body
run through the ORIGINAL function first, its result returned unchanged. Nothing
drifted (or any other value): a pure pass-through.

Removal plan (docs/ascend.md): with the planner registry upstreamed to afd-plugin,
an unknown ``async_moe_split`` value is refused by the plugin naming its registry,
and this seam is dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from afd_split.hook.facts.drift_guard import (
    PATCH_MARKER,
    TOKEN_BALANCED_SPLIT,
    drift_refusal,
    installed_branch,
)
from afd_split.hook.facts.pinned import CONNECTOR_CLASS, EXTRA_INFO, EXTRA_INFO_NAME

if TYPE_CHECKING:  # names of the pinned header; never imported at run time
    from collections.abc import Mapping

    from afd_plugin.connectors.npu.async_cam import AFDAsyncExtraInfo

def make_extra_info_patch(original: Callable,
                          drifted: Callable[[], tuple[str, ...]]) -> classmethod:
    # Upstream source: afd-plugin main 2e4378f / release/v0.19.1rc1 2f4f462,
    # connectors/npu/async_cam.py CAMAsyncAFDConnector.parse_extra_config (a classmethod;
    # ``original`` is its function).
    # Patch reason: a seam module the hook left unpatched on drift may be the validator's
    # own; the plugin's validator then refuses token_balanced without naming the drift.
    # Patch functionality: after the original parses, an async-MoE token_balanced config
    # is refused (PluginDriftError) naming every drifted seam (``drifted()``, read at call
    # time: the drift log of the process's import hook).
    # Delegation exception: the whole upstream body runs through the original first, and
    # its result is returned unchanged.
    # Signature: matches upstream; no added parameters.
    def parse_extra_config(cls, raw: Mapping[str, Any] | None) -> AFDAsyncExtraInfo:
        extra_info = original(cls, raw)
        # ### PATCH START: afd_split drifted-seam refusal
        if extra_info.async_moe_ubatching and extra_info.async_moe_split == TOKEN_BALANCED_SPLIT:
            reasons = drifted()
            if reasons:
                raise drift_refusal(reasons)
        # ### PATCH END: afd_split drifted-seam refusal
        return extra_info

    setattr(parse_extra_config, PATCH_MARKER, EXTRA_INFO)
    return classmethod(parse_extra_config)


def extra_info_seam(connector_module: ModuleType) -> Callable:
    """The connector class's ``parse_extra_config`` function (unwrapped from its classmethod)."""
    method = vars(vars(connector_module)[CONNECTOR_CLASS])[EXTRA_INFO_NAME]
    return getattr(method, "__func__", method)


def install_extra_info(connector_module: ModuleType,
                       drifted: Callable[[], tuple[str, ...]]) -> bool:
    """Patch the connector's extra-config parser (drift-checked, idempotent); True when now."""
    parse = extra_info_seam(connector_module)
    if getattr(parse, PATCH_MARKER, None) == EXTRA_INFO:
        return False
    installed_branch(EXTRA_INFO, parse)
    setattr(vars(connector_module)[CONNECTOR_CLASS], EXTRA_INFO_NAME,
            make_extra_info_patch(parse, drifted))
    return True
