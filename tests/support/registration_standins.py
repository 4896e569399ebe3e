"""A stand-in afd_plugin / vLLM package tree on disk, and the process script that registers
the general plugins in a chosen order, as ``load_general_plugins()`` does.

The tree holds what the registration facts need, written from the pinned code
(afd-plugin main 2e4378f): ``register_afd`` patches
``vllm.forward_context.set_forward_context`` and rebinds it only in modules already
imported (compat/patches/async_dp_forward_context.py); the runner module binds
``set_forward_context`` by name when it is imported and imports the NPU stack
(``torch_npu``); the validation module imports no NPU module. Seam bodies come
from hook_standins.standin_source (the pinned headers verbatim).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.fork_server import ForkServer
from tests.support.hook_standins import (
    standin_connector_source,
    standin_forward_source,
    standin_source,
)

ROOT = Path(__file__).resolve().parents[2]
FUTURE = "from __future__ import annotations\n\n"
PROCESS_TIMEOUT_S = 120

FORWARD_CONTEXT_PATCH = '''
import sys

import vllm.forward_context as forward_context_module

_FORWARD_CONTEXT_IMPORT_MODULES = ("vllm.v1.worker.gpu_model_runner",
                                   "vllm_ascend.ascend_forward_context")


def set_forward_context(*args, **kwargs):
    raise AssertionError("not called in these tests")


set_forward_context.afd_patched = True
forward_context_module.set_forward_context = set_forward_context
for module_name in _FORWARD_CONTEXT_IMPORT_MODULES:
    module = sys.modules.get(module_name)
    if module is not None:
        module.set_forward_context = set_forward_context
'''

RUNNER_IMPORTS = (
    "import torch_npu  # noqa: F401  (the NPU runner stack)\n"
    "from vllm.forward_context import set_forward_context  # noqa: F401\n"
    "import afd_plugin.connectors.npu.async_cam  # noqa: F401\n"
    "import afd_plugin.compat.npu.feature_validation  # noqa: F401\n"
)


def write_tree(root: Path, branch: str = "main", *, with_torch_npu: bool,
               header_overrides: dict[str, str] | None = None) -> Path:
    """The stand-in packages under ``root`` (torch_npu only when ``with_torch_npu``; a seam
    key in ``header_overrides`` gets that header instead of the pinned one: a drifted plugin)."""
    validation, runner = standin_source(branch, header_overrides)
    files = {
        "afd_plugin/__init__.py": "def register_afd():\n"
                                  "    import afd_plugin.compat.patches.forward_context  # noqa\n",
        "afd_plugin/compat/__init__.py": "",
        "afd_plugin/compat/patches/__init__.py": "",
        "afd_plugin/compat/patches/forward_context.py": FORWARD_CONTEXT_PATCH,
        "afd_plugin/compat/npu/__init__.py": "",
        "afd_plugin/compat/npu/feature_validation.py": validation,
        "afd_plugin/connectors/__init__.py": "",
        "afd_plugin/connectors/npu/__init__.py": "",
        "afd_plugin/connectors/npu/async_cam.py": standin_connector_source(branch, header_overrides),
        "afd_plugin/model_executor/__init__.py": "",
        "afd_plugin/model_executor/models/__init__.py": "",
        "afd_plugin/model_executor/models/npu/__init__.py": "",
        "afd_plugin/model_executor/models/npu/deepseek_v2_async_cam_forward.py":
            standin_forward_source(branch, header_overrides),
        "afd_plugin/v1/__init__.py": "",
        "afd_plugin/v1/worker/__init__.py": "",
        "afd_plugin/v1/worker/npu/__init__.py": "",
        "afd_plugin/v1/worker/npu/attention_model_runner.py":
            runner.replace(FUTURE, FUTURE + RUNNER_IMPORTS, 1),
        "vllm/__init__.py": "",
        "vllm/forward_context.py": "def set_forward_context(*args, **kwargs):\n"
                                   "    raise AssertionError('unpatched')\n",
        "vllm/v1/__init__.py": "",
        "vllm/v1/worker/__init__.py": "",
        "vllm/v1/worker/ubatch_utils.py": "from typing import NamedTuple\n\n\n"
                                          "class UBatchSlice(NamedTuple):\n"
                                          "    request_slice: slice\n"
                                          "    token_slice: slice\n",
    }
    if with_torch_npu:
        files["torch_npu/__init__.py"] = ""
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


PROCESS_SCRIPT = r'''
import importlib, importlib.abc, json, sys

order, registration, loads = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
attempted = []


class NpuImportRecorder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch_npu", "vllm_ascend"):
            attempted.append(name)
        return None


sys.meta_path.insert(0, NpuImportRecorder())
RUNNER = "afd_plugin.v1.worker.npu.attention_model_runner"
VALIDATION = "afd_plugin.compat.npu.feature_validation"
FORWARD = "afd_plugin.model_executor.models.npu.deepseek_v2_async_cam_forward"


def register_afd_split():
    from afd_split.hook import install as hook
    if registration == "register":
        hook.register()
    else:  # "eager": what register() did before (import the runner module at registration)
        from afd_split.hook.install import install_deferred
        try:
            importlib.import_module(RUNNER)
        except ImportError as error:
            attempted.append(f"ImportError: {error}")
        install_deferred(new_session=hook.engine_session)


def register_afd():
    import afd_plugin
    afd_plugin.register_afd()


plugins = {"afd": register_afd, "afd_split": register_afd_split}
for name in loads:
    if name == "import_runner":
        importlib.import_module(RUNNER)
    elif name == "import_validation":
        importlib.import_module(VALIDATION)
    elif name == "import_forward":  # the worker's first async-MoE forward
        importlib.import_module(FORWARD)
    elif name == "plugins":
        for plugin in order.split(">"):
            plugins[plugin]()

from afd_split.hook.facts.drift_guard import PATCH_MARKER
from afd_split.hook.facts.pinned import function_header

from afd_split.hook.install import SeamImportHook

report = {"attempted": attempted, "loaded": sorted(m for m in (RUNNER, VALIDATION) if m in sys.modules),
          "hooks": sum(isinstance(finder, SeamImportHook) for finder in sys.meta_path)}
if VALIDATION in sys.modules:
    validator = vars(sys.modules[VALIDATION])["_fail_if_unsupported_npu_async_moe_ubatching_features"]
    report["validator"] = [getattr(validator, PATCH_MARKER, None), function_header(validator)]
if FORWARD in sys.modules:
    forward = vars(sys.modules[FORWARD])["run_async_moe_ubatch_afd_forward"]
    report["forward"] = [getattr(forward, PATCH_MARKER, None), function_header(forward)]
CONNECTOR = "afd_plugin.connectors.npu.async_cam"
if CONNECTOR in sys.modules:
    dispatch = vars(sys.modules[CONNECTOR].CAMAsyncAFDConnector)["send_attn_output"]
    report["dispatch"] = [getattr(dispatch, PATCH_MARKER, None), function_header(dispatch)]
    parse = vars(sys.modules[CONNECTOR].CAMAsyncAFDConnector)["parse_extra_config"].__func__
    report["extra_info"] = [getattr(parse, PATCH_MARKER, None), function_header(parse)]
if RUNNER in sys.modules:
    runner = sys.modules[RUNNER]
    planner = vars(runner.AFDNPUAttentionModelRunner)["_build_attention_metadata_with_async_moe_ubatches"]
    slicer = vars(runner)["split_attn_metadata"]
    report["planner"] = [getattr(planner, PATCH_MARKER, None), function_header(planner)]
    report["slicer"] = [getattr(slicer, PATCH_MARKER, None), function_header(slicer)]
    report["runner_set_forward_context_patched"] = getattr(runner.set_forward_context, "afd_patched", False)
print(json.dumps(report))
'''


def run_process(fork_server: ForkServer, tree: Path, order: str, *, loads: str,
                registration: str = "register") -> dict:
    """One fresh process (forked by ``fork_server``: no afd_split, afd_plugin or vLLM module
    loaded, ``tree`` and the repository first on ``sys.path``): the plugins registered in
    ``order`` ("afd>afd_split" or the reverse), with the imports ``loads`` ("plugins",
    "import_runner", "import_validation", "import_forward", in order)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    done = fork_server.run(PROCESS_SCRIPT, [order, registration, loads], env=env,
                           timeout=PROCESS_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
