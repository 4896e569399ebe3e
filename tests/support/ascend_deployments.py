"""Shared by the attach-mode tests: the harness's CPU servers standing in for deployments.

Real servers (``python -m pytest_afd.serving.server``) at small settings, started per test
or shared through ``policy_servers`` (tests/ascend_backend/conftest.py); an inner pytest
session attaches to them through the deployment variables.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

from pytest_afd.core.backend import RunSettings
from pytest_afd.serving.http_backend import cpu_server_spec
from pytest_afd.serving.lifecycle import ServerGroup

REPO = Path(__file__).resolve().parents[2]
TOPOLOGY = "dp3pcp8-ep8"
REHEARSAL = REPO / ".ci" / "rehearse-nightly"
DEPLOYMENT_VARIABLES = ("AFD_ASCEND_SERVER_URL", "AFD_ASCEND_SERVER_SETTINGS", "AFD_ASCEND_DEPLOYMENTS",
                        "AFD_ASCEND_DEPLOY_COMMAND", "AFD_BACKEND", "AFD_REQUIRE_HARDWARE",
                        "AFD_REFERENCE_PHASE", "AFD_EVIDENCE_DIR", "AFD_ALLOW_EMULATED",
                        "AFD_ASCEND_SERVED_MODEL_NAME", "AFD_DEVICES_PER_NODE")
SMALL = {"block_size": 16, "max_num_batched_tokens": 512, "max_num_seqs": 8}
CASES = """
import pytest
from pytest_afd.core.backend import PromptRequest, RunSettings

SMALL = dict(block_size=16, max_num_batched_tokens=512, max_num_seqs=8, return_logits=False)
PROMPTS = [PromptRequest("r0", tuple(range(1, 40)))]


def run(backend, policy):
    outputs = backend.run(PROMPTS, RunSettings(split_policy=policy, **SMALL))
    assert outputs.requests[0].error is None, outputs.requests[0].error
    return outputs
"""


def cpu_servers(tmp_path: Path, *policies: str) -> ServerGroup:
    """One CPU server per policy, named after it; entering the group starts them together
    (their torch imports overlap) and returns once each is healthy."""
    specs = [cpu_server_spec(RunSettings(split_policy=policy, **SMALL), name=policy,
                             log_dir=tmp_path, topology=TOPOLOGY, model_name="reduced", seed=0)
             for policy in policies]
    return ServerGroup(specs, tmp_path)


def entry(url: str, policy: str, **extra) -> dict:
    return {"url": url, "settings": {"split_policy": policy, **SMALL}, **extra}


# A conftest declaring each case's deployments from its ``afd_deployments`` marker.
DECLARING_CONFTEST = """
import pytest
from pytest_afd.core.backend import RunSettings

SMALL = dict(block_size=16, max_num_batched_tokens=512, max_num_seqs=8)


def pytest_afd_deployment_settings(config, item):
    marker = item.get_closest_marker("afd_deployments")
    if marker is None:
        return None
    return [{"settings": RunSettings(split_policy=policy, **SMALL)} for policy in marker.args]
"""


def rehearsal_module() -> ModuleType:
    """``.ci/rehearse-nightly`` (a script without a .py suffix) loaded as a module."""
    loader = importlib.machinery.SourceFileLoader("rehearse_nightly", str(REHEARSAL))
    spec = importlib.util.spec_from_loader("rehearse_nightly", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
