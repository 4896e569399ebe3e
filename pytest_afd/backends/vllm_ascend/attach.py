"""Attach to deployments (a file of them, or the one-deployment shorthand), or deploy through a command.

What each deployment is comes from the deployment itself: its ``/v1/models``
listing (served name, checkpoint path, context length), the harness's own CPU
server's ``/afd/describe`` (device ``cpu``: emulated), and the
``afd-launch-plan --json`` file it was started from when the entry names one
(nodes, devices per node, quantization, tokenizer and execution mode). A fact
nothing reports stays out of the description, and the manifest records it as
absent with the reason.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_afd.backends.vllm_ascend.deployments import (
    ENV_DEPLOY_COMMAND,
    ENV_DEPLOYMENTS,
    LAUNCH_FIELDS,
    AttachedSet,
    Deployment,
    DeploymentConfigError,
    DeployPool,
    deploy_command,
    deploy_timeout,
    launch_key,
    load_deployments,
    plan_work_dir,
    require_reachable,
    settings_from,
)
from pytest_afd.backends.vllm_ascend.listing import (
    EXECUTION_EAGER,
    checkpoint_facts,
    model_path_for,
    plan_document,
    plan_facts,
    read_plan,
)
from pytest_afd.backends.vllm_ascend.plan import ENV_ATTACH_SETTINGS, ENV_ATTACH_URL
from pytest_afd.core.backend import BackendUnavailable, RunSettings
from pytest_afd.results.manifest import absent
from pytest_afd.results.stand_in import SERVED_LATER
from pytest_afd.serving.client import ClientError, CompletionsClient
from pytest_afd.serving.http_backend import server_side_settings
from pytest_afd.topology.spec import Topology

ENV_SERVED_MODEL_NAME = "AFD_ASCEND_SERVED_MODEL_NAME"
ENV_DEVICES_PER_NODE = "AFD_DEVICES_PER_NODE"
MODELS_PATH = "/v1/models"  # OpenAI-compatible model listing (vLLM and the CPU server)
DESCRIBE_PATH = "/afd/describe"  # only the harness's own server answers it


def served_model_name(base_url: str, environ: Mapping[str, str], given: str | None = None) -> str:
    """``given`` or ``$AFD_ASCEND_SERVED_MODEL_NAME``, else the one model ``/v1/models`` lists.

    A deployment started with another ``--served-model-name`` than the recipe's
    would answer every request with HTTP 400; asking it first avoids that, and
    when it cannot say (none or several models) the error names the variable.
    """
    given = (given or environ.get(ENV_SERVED_MODEL_NAME, "")).strip()
    if given:
        return given
    where = f"{base_url}{MODELS_PATH}"
    try:
        listing = CompletionsClient(base_url, model="").get_json(MODELS_PATH)
        served = [str(entry["id"]) for entry in listing["data"]]
    except (ClientError, ValueError, KeyError, TypeError) as error:
        raise BackendUnavailable(
            f"{where}: cannot read the served model name ({type(error).__name__}: {error}); "
            f"set {ENV_SERVED_MODEL_NAME}") from None
    if len(served) != 1:
        raise BackendUnavailable(f"{where} lists {len(served)} models {served}, not one; "
                                 f"set {ENV_SERVED_MODEL_NAME} to the one to test")
    return served[0]


def declared_settings(environ: Mapping[str, str]) -> RunSettings:
    text = environ.get(ENV_ATTACH_SETTINGS)
    if not text:
        raise BackendUnavailable(f"{ENV_ATTACH_URL} is set but {ENV_ATTACH_SETTINGS} is not: "
                                 "say which RunSettings the deployment was started with (JSON)")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise DeploymentConfigError(f"${ENV_ATTACH_SETTINGS}: not JSON ({error})") from None
    return settings_from(value, f"${ENV_ATTACH_SETTINGS}")


def attached_deployments(environ: Mapping[str, str]) -> tuple[list[Deployment], str]:
    """The deployments to attach to and where they were declared."""
    path = environ.get(ENV_DEPLOYMENTS, "").strip()
    if path:
        if environ.get(ENV_ATTACH_URL):
            raise DeploymentConfigError(f"both ${ENV_DEPLOYMENTS} and ${ENV_ATTACH_URL} are set; "
                                        "the URL is the one-deployment shorthand: use one")
        return load_deployments(path), f"${ENV_DEPLOYMENTS}={path}"
    url = environ[ENV_ATTACH_URL].rstrip("/")
    return [Deployment(url=url, settings=declared_settings(environ))], f"${ENV_ATTACH_URL}={url}"


def deployment_facts(url: str) -> dict[str, Any]:
    """What the deployment says it is: its model listing, and ``/afd/describe`` if it has one."""
    client = CompletionsClient(url, model="")
    facts: dict[str, Any] = {"url": url}
    try:
        models = client.get_json(MODELS_PATH)["data"]
        facts["models"] = [{key: entry[key] for key in ("id", "root", "max_model_len")
                            if key in entry} for entry in models]
    except (ClientError, ValueError, KeyError, TypeError) as error:
        facts["models_error"] = f"{type(error).__name__}: {error}"
    try:
        described = client.get_json(DESCRIBE_PATH)["backend"]
    except (ClientError, ValueError, KeyError, TypeError):
        described = None  # a vLLM deployment: no such route
    if isinstance(described, Mapping):
        facts["stand_in"] = {"device": described.get("device"),
                             "num_layers": described.get("model", {}).get("num_layers")}
    return facts


def _model_facts(facts: list[dict[str, Any]], plans: list[dict[str, Any]]) -> dict[str, Any]:
    """Manifest model facts every deployment agrees on (a disagreement is left out)."""
    model: dict[str, Any] = {}
    layers = {item["stand_in"]["num_layers"] for item in facts if item.get("stand_in")}
    if len(layers) == 1 and None not in layers:
        model["num_layers"] = layers.pop()
    roots = {entry.get("root") for item in facts for entry in item.get("models", [])} - {None}
    paths = {plan["model_path"] for plan in plans if "model_path" in plan}
    checkpoint = paths or roots
    if len(checkpoint) == 1:
        model["checkpoint_path"] = checkpoint.pop()
    for key in ("quantization", "tokenizer_mode", "execution_mode"):
        values = {plan[key] for plan in plans if key in plan}
        if len(values) == 1:
            model[key] = values.pop()
    if "tokenizer_mode" in model and "checkpoint_path" in model:
        model["tokenizer"] = f"{model['checkpoint_path']} (tokenizer mode {model['tokenizer_mode']})"
    return model


def _describe(deployments: list[Deployment], source: str) -> dict[str, Any]:
    facts = [deployment_facts(item.url) for item in deployments]
    plans = [plan_facts(read_plan(item.plan, source)) for item in deployments if item.plan]
    description: dict[str, Any] = {
        "deployments": [{**fact, "settings": launch_key(item.settings)}
                        for fact, item in zip(facts, deployments, strict=True)],
        "model": _model_facts(facts, plans),
    }
    stand_ins = {item["stand_in"]["device"] for item in facts if item.get("stand_in")}
    if stand_ins:
        # The harness's own server stands in: every result says it was emulated.
        description["emulated"] = True
        description["device_type"] = f"{', '.join(sorted(map(str, stand_ins)))} (pytest-afd server "
        description["device_type"] += "standing in for the deployment)"
    for key in ("devices_per_node", "node_count"):
        values = {plan[key] for plan in plans}
        if len(values) == 1:
            description[key] = values.pop()
    return description


def attach_or_deploy(topology: Topology, model_name: str, environ: Mapping[str, str],
                     results_dir: str | os.PathLike[str] | None, *,
                     devices_per_node: int | None = None) -> tuple[Any, dict[str, Any]]:
    """(launcher, description facts) for attach or deploy-command mode; ``devices_per_node``
    is the user's ``--afd-devices-per-node`` (the plans a deploy command gets are built for it)."""
    if environ.get(ENV_DEPLOY_COMMAND) and not (environ.get(ENV_DEPLOYMENTS)
                                                or environ.get(ENV_ATTACH_URL)):
        devices = devices_per_node or _devices_per_node(environ)
        return _deploy_pool(topology, model_name, environ, results_dir, devices)
    deployments, source = attached_deployments(environ)
    for item in deployments:
        require_reachable(item.url, source)
    served = {item.url: served_model_name(item.url, environ, item.served_model_name)
              for item in deployments if item.serves(topology.canonical, model_name)}
    launcher = AttachedSet(deployments, source=source, topology=topology.canonical,
                           model=model_name, served_names=served)
    description = {"mode": "attach", "deployments_source": source,
                   **_describe([item for item in deployments if item.url in served], source)}
    if len(deployments) == 1:
        description["server_url"] = deployments[0].url
    return launcher, description


def _devices_per_node(environ: Mapping[str, str]) -> int:
    text = environ.get(ENV_DEVICES_PER_NODE, "").strip()
    if not text.isdigit() or int(text) < 1:
        raise DeploymentConfigError(
            f"${ENV_DEPLOY_COMMAND} needs the nodes' NPU count for the plans it hands the "
            f"command: --afd-devices-per-node or ${ENV_DEVICES_PER_NODE} (got {text!r}); the "
            "harness never assumes a default")
    return int(text)


def _deploy_pool(topology: Topology, model_name: str, environ: Mapping[str, str],
                 results_dir: str | os.PathLike[str] | None,
                 devices: int) -> tuple[DeployPool, dict[str, Any]]:
    command = deploy_command(environ)

    def plan_for(settings: RunSettings) -> dict[str, Any]:
        return plan_document(topology, model_name, server_side_settings(settings, LAUNCH_FIELDS),
                             devices_per_node=devices, environ=environ)

    pool = DeployPool(command, plan_for=plan_for,
                      served_name=lambda url: served_model_name(url, environ),
                      timeout_s=deploy_timeout(environ),
                      work_dir=plan_work_dir(results_dir) / f"{topology.canonical}-{model_name}")
    path = model_path_for(model_name, environ)
    # Every plan runs eager (validate_plan requires --enforce-eager); the checkpoint's own
    # config.json gives layers and quantization when its path is readable here.
    model = {"execution_mode": EXECUTION_EAGER, **checkpoint_facts(path)}
    # Not readable here: the deployment reports it once up (a pytest-afd server does).
    model.setdefault("num_layers", absent(SERVED_LATER.format(path=path)))
    # The whole command line: which deploy command served the results (`pytest-afd deploy-cpu`).
    description = {"mode": "deploy", "deploy_command": shlex.join(command),
                   "devices_per_node": devices, "node_count": topology.nodes_needed(devices),
                   "model": model}
    return pool, description


def describe_deployed(pool: DeployPool) -> dict[str, Any]:
    """Facts from the deployments the command started so far (for the manifest)."""
    urls = [server.base_url for server in pool.up.values()]
    if not urls:
        return {}
    return _describe([Deployment(url=url, settings=RunSettings()) for url in urls], "deployed")


__all__ = ["Path", "attach_or_deploy", "declared_settings", "describe_deployed",
           "served_model_name"]
