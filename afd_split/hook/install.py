"""The vLLM general plugin's entry point and the hook's one install path.

Entry point (pyproject ``[project.entry-points."vllm.general_plugins"]``):
``afd_split = "afd_split.hook.install:register"``. Without afd_plugin it does
nothing, and a process where the hook is not installed still refuses
``token_balanced`` through the plugin's own validator, so the value can never run
unplanned. Enable per deployment with
``connector_extra_config.async_moe_split="token_balanced"`` and add ``afd_split``
to ``VLLM_PLUGINS`` where that list is set. This module is the only importer of
``afd_split.hook.patches``.

Deferred seam patching: registration imports nothing of afd_plugin's NPU stack.

vLLM calls general plugins in every process. In the API server,
``AsyncEngineArgs.add_cli_args`` calls ``load_general_plugins()`` before
vLLM-Ascend's ``pre_register_and_update()``, so importing the plugin's runner
module there would pull torch_npu and the NPU runner stack into a process that
has not set them up (afd_plugin itself defers that import). Entry points also
load in filesystem order: importing the runner module before afd_plugin's own
``register_afd`` has patched ``vllm.forward_context.set_forward_context`` would
bind the unpatched function into every module the runner imports.

So ``install_deferred`` imports nothing: it patches a seam module that is
already loaded, and puts a ``sys.meta_path`` finder in front that patches the
others right after they first execute, in whichever process loads them (the
worker, after vLLM-Ascend and afd_plugin have set up). The validation module,
the runner module and the connector module (the expert-load dispatch seam) are
patched independently: an FFN worker may load only the first. A module whose seam
drifted is left unpatched and its import finishes (``drift_guard``): the drift is
logged once and token_balanced refused naming the seam. The runner module's
metadata router also gets the evidence-only recorder (``evidence_only``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import ModuleType
from typing import Any

from afd_split.hook.facts.drift_guard import (
    PATCH_MARKER,
    TOKEN_BALANCED_SPLIT,
    DriftLog,
    guarded,
    installed_branch,
)
from afd_split.hook.facts.pinned import (
    CONNECTOR_CLASS,
    DISPATCH,
    DISPATCH_NAME,
    EXTRA_INFO,
    EXTRA_INFO_MODULE,
    FORWARD_MODULE,
    PLANNER,
    PLANNER_NAME,
    RUNNER_MODULE,
    SLICER,
    SLICER_NAME,
    VALIDATION_MODULE,
)
from afd_split.hook.glue.runner import (
    PluginSeams,
    plugin_request_split,
    runner_pcp_unavailable,
    seams_of,
)
from afd_split.hook.glue.session import engine_session
from afd_split.hook.patches.dispatch import install_dispatch
from afd_split.hook.patches.extra_info import extra_info_seam, install_extra_info
from afd_split.hook.patches.forward import install_forward
from afd_split.hook.patches.planner import PLANNER_PATCHES
from afd_split.hook.patches.router import install_evidence_only
from afd_split.hook.patches.slicer import make_slicer_patch
from afd_split.hook.patches.validator import install_validator
from afd_split.hook.planning.stages import HookSession

ModulePatch = Callable[[ModuleType], Any]

logger = logging.getLogger(__name__)


class PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the seam patch, on the freshly executed module."""

    def __init__(self, loader, patch: ModulePatch) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name: str):
        # get_source / get_filename / is_package ... for inspect, linecache and pkgutil.
        return getattr(self.loader, name)


class SeamImportHook(importlib.abc.MetaPathFinder):
    """Finds a seam module with the finders behind it and wraps its loader."""

    def __init__(self, patches: Mapping[str, ModulePatch], drift: DriftLog) -> None:
        self.patches = dict(patches)
        self.drift = drift

    def find_spec(self, fullname, path, target=None):
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)  # the import system's own check
            if finder is self or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None:
            spec.loader = PatchingLoader(spec.loader, patch)
        return spec


def install_runner(seams: PluginSeams, *, new_session: Callable[[Any], HookSession]) -> str:
    """Patch the planner and slicer seams of a loaded runner module (both drift-checked
    before either is patched; idempotent); returns the branch recognised."""
    planner = vars(seams.runner_class)[PLANNER_NAME]
    slicer = vars(seams.runner_module)[SLICER_NAME]
    if getattr(planner, PATCH_MARKER, None) == PLANNER:  # our own attribute, set below
        return "already-installed"
    branch = installed_branch(PLANNER, planner)
    installed_branch(SLICER, slicer)
    setattr(seams.runner_module, SLICER_NAME, make_slicer_patch(slicer))
    setattr(seams.runner_class, PLANNER_NAME, PLANNER_PATCHES[branch](planner, seams, new_session))
    return branch


def ensure_forward_patched() -> None:
    """Before the first relaid PCP stage: the pipeline that runs it must be the patched one,
    or upstream would slice the relaid rows as the parent's. Importing it runs the import
    hook (which patches it, or leaves a drifted one alone); the check here then patches a
    module loaded before the hook, or raises ``PluginDriftError`` naming the drift."""
    install_forward(importlib.import_module(FORWARD_MODULE))


def seam_patches(new_session: Callable[[Any], HookSession],
                 drift: DriftLog | None = None) -> dict[str, ModulePatch]:
    """Module name -> what to patch in it once loaded (a drifted module is left unpatched
    and noted in ``drift``, which the validator and planner read when they run)."""
    drift = DriftLog() if drift is None else drift

    def patch_runner(module: ModuleType) -> str:
        # Evidence-only mode first: it never raises, so a drifted planner seam cannot skip it.
        install_evidence_only(module, new_session, plugin_request_split)
        return install_runner(replace(seams_of(module), drifted=drift.reasons,
                                      ensure_forward=ensure_forward_patched),
                              new_session=new_session)

    def pcp_unavailable() -> str | None:
        # PCP is judged from the runner module loaded when the validator runs: this
        # module may load first (the Attention worker imports it before the runner).
        # A drifted runner module is refused through ``drift.reasons`` instead.
        if PLANNER in drift.drifted or SLICER in drift.drifted:
            return None
        return runner_pcp_unavailable(sys.modules.get(RUNNER_MODULE))

    def patch_validation(module: ModuleType) -> bool:
        return install_validator(module, plugin_request_split, pcp_unavailable, drift.reasons)

    def patch_connector(module: ModuleType) -> bool:
        # Both seams drift-checked before either is patched (the module stays whole).
        dispatch = vars(vars(module)[CONNECTOR_CLASS])[DISPATCH_NAME]
        if getattr(dispatch, PATCH_MARKER, None) != DISPATCH:
            installed_branch(DISPATCH, dispatch)
        parse = extra_info_seam(module)
        if getattr(parse, PATCH_MARKER, None) != EXTRA_INFO:
            installed_branch(EXTRA_INFO, parse)
        return install_dispatch(module) | install_extra_info(module, drift.reasons)

    patches = {VALIDATION_MODULE: patch_validation, RUNNER_MODULE: patch_runner,
               EXTRA_INFO_MODULE: patch_connector, FORWARD_MODULE: install_forward}
    return {name: guarded(patch, drift) for name, patch in patches.items()}


def install_deferred(new_session: Callable[[Any], HookSession]) -> SeamImportHook:
    """Patch the loaded seam modules now and the others when they load (one hook per
    process: a second registration reuses it)."""
    hook = next((f for f in sys.meta_path if isinstance(f, SeamImportHook)), None)
    if hook is None:
        drift = DriftLog()
        hook = SeamImportHook(seam_patches(new_session, drift), drift)
        sys.meta_path.insert(0, hook)
    for name, patch in hook.patches.items():
        module = sys.modules.get(name)
        if module is not None:
            patch(module)
    return hook


PLUGIN_NAME = "afd_split"
"""Entry-point name (what ``VLLM_PLUGINS`` lists)."""


def register() -> None:
    """``vllm.general_plugins`` entry point: install the hook where afd_plugin is installed.

    Imports nothing of afd_plugin, vLLM-Ascend or torch_npu: each seam module is
    patched when it is already loaded, else right after it first loads.
    """
    if importlib.util.find_spec("afd_plugin") is None:
        logger.debug("%s: afd_plugin is not installed; nothing to patch", PLUGIN_NAME)
        return
    install_deferred(new_session=engine_session)
    logger.info("%s: async_moe_split=%r will be routed through afd_split when afd_plugin's "
                "seam modules load", PLUGIN_NAME, TOKEN_BALANCED_SPLIT)
