"""Drift facts: the patch marker, ``installed_branch``, ``PluginDriftError`` and the drift log.

A drifted seam never breaks the plugin: it is left unpatched and token_balanced refused.

vLLM calls general plugins first in every process, so the import hook (``install``)
patches afd_plugin's seam modules inside the plugin's own imports. A seam whose
installed header (or pipeline body) matches no pinned variant must not turn that
import into an error: every vLLM start would fail, also for users who never ask
for ``token_balanced`` (a container that upgraded afd-plugin, a developer with
this harness installed next to vLLM). ``guarded`` therefore catches
``PluginDriftError`` from a module's patch, leaves that module exactly as the
plugin built it, logs one error naming the seam, the installed header and the
pinned commits, and records the drift in the hook's ``DriftLog``. The patched
validator and planner read the log when ``token_balanced`` is asked for and
refuse it naming the drifted seam; ``request`` and ``none`` run as the plugin
alone (drifted modules are the plugin's own, patched ones delegate).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from afd_split.hook.facts.pinned import function_header, seams_for

logger = logging.getLogger(__name__)

UNKNOWN_SEAM = "unknown"

TOKEN_BALANCED_SPLIT = "token_balanced"
"""The ``async_moe_split`` value this hook adds; distinct from PR #203's ``"token"``."""

PATCH_MARKER = "__afd_split_patch__"
"""Attribute on every patch function naming its seam; makes installation idempotent."""


class PluginDriftError(RuntimeError):
    """The installed afd_plugin's seam no longer reads as any pinned variant (``seam``: its
    ``pinned`` key, so the import hook can leave the module unpatched and name it)."""

    def __init__(self, message: str, *, seam: str | None = None) -> None:
        super().__init__(message)
        self.seam = seam


def installed_branch(key: str, function: Callable) -> str:
    """The pinned branch whose header ``function`` carries; PluginDriftError when none does."""
    header = function_header(function)
    variants = seams_for(key)
    for seam in variants:
        if seam.normalized_header == header:
            return seam.branch
    pinned = "; ".join(f"{seam.branch}@{seam.commit[:12]}: {seam.normalized_header}"
                       for seam in variants)
    raise PluginDriftError(
        f"afd_plugin seam {variants[0].module}.{variants[0].qualname} drifted: installed "
        f"header {header!r} matches no pinned variant ({pinned}); re-pin it (AGENTS.md) before "
        f"async_moe_split={TOKEN_BALANCED_SPLIT!r} can run", seam=key,
    )


@dataclass
class DriftLog:
    """The seams found drifted in this process (seam key -> the drift message)."""

    drifted: dict[str, str] = field(default_factory=dict)

    def record(self, error: PluginDriftError, module_name: str) -> bool:
        """Note one drift; True (and one logged error) the first time this seam drifts."""
        seam = error.seam or UNKNOWN_SEAM
        if seam in self.drifted:
            return False
        self.drifted[seam] = str(error)
        logger.error("afd_split: afd_plugin seam %r drifted; %s left unpatched (the plugin runs "
                     "as installed, async_moe_split=%r is refused): %s",
                     seam, module_name, TOKEN_BALANCED_SPLIT, error)
        return True

    def reasons(self) -> tuple[str, ...]:
        """One refusal reason per drifted seam, naming it (empty: nothing drifted)."""
        return tuple(f"afd_plugin seam {seam!r} drifted from the pinned headers and was left "
                     f"unpatched ({message})" for seam, message in self.drifted.items())


def drift_refusal(reasons: tuple[str, ...]) -> PluginDriftError:
    """The error refusing ``token_balanced`` after seams drifted (``DriftLog.reasons``)."""
    return PluginDriftError(f"async_moe_split={TOKEN_BALANCED_SPLIT!r} is refused: "
                            + "; ".join(reasons))


def guarded(patch: Callable[[ModuleType], Any], log: DriftLog) -> Callable[[ModuleType], Any]:
    """``patch`` that leaves a drifted module unpatched and records the drift instead of
    raising out of the plugin's import."""

    def patch_or_record(module: ModuleType) -> Any:
        try:
            return patch(module)
        except PluginDriftError as error:
            log.record(error, module.__name__)
            return None

    return patch_or_record

