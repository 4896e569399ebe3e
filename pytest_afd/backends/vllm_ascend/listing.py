"""What a deployment is started from: its ``afd-launch-plan`` command line, and facts from a plan.

:func:`plan_document` is what ``--afd-list-deployments`` prints per entry and
what ``AFD_ASCEND_DEPLOY_COMMAND up`` receives as ``PLAN_JSON``: the settings,
the topology, and the ``afd-launch-plan`` argv *without* ``--node-address``
(the job system knows the nodes it allocated; the wrapper appends one
``--node-address`` per node, plus ``--nic-name`` on multi-node plans).
:func:`plan_facts` reads manifest facts from a plan JSON a deployment was
started from (``afd-launch-plan --json``): nodes, devices per node, model path,
quantization, tokenizer mode and execution mode.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_afd.backends.vllm_ascend.deployments import launch_key
from pytest_afd.backends.vllm_ascend.launch import (
    POLICY_TO_SPLIT,
    LaunchOptions,
    LaunchPlanError,
    build_launch_plan,
)
from pytest_afd.backends.vllm_ascend.plan import flag_values, has_flag
from pytest_afd.core.backend import RunSettings
from pytest_afd.topology.spec import Topology

LAUNCH_PLAN_COMMAND = "afd-launch-plan"
ENV_MODEL_PATH = "AFD_ASCEND_MODEL_PATH"
# Stand-in addresses that only check the plan can be built (never printed as the plan).
_CHECK_ADDRESS_BASE = "10.0.0."
_CHECK_NIC = "eth0"
MODEL_ARGUMENT = 2
EXECUTION_EAGER = "eager (--enforce-eager)"
EXECUTION_GRAPH = "graph mode (no --enforce-eager)"


def model_path_for(model_name: str, environ: Mapping[str, str]) -> str:
    template = environ.get(ENV_MODEL_PATH, "")
    return template.replace("{model}", model_name) if template else model_name


def launch_plan_argv(topology: Topology, model_path: str, devices_per_node: int,
                     settings: RunSettings) -> list[str]:
    """The ``afd-launch-plan`` argv for ``settings`` (node addresses left to the job system)."""
    argv = [LAUNCH_PLAN_COMMAND, "--npu-topology", topology.canonical, "--model", model_path,
            "--devices-per-node", str(devices_per_node)]
    if topology.is_afd:
        argv += ["--split", POLICY_TO_SPLIT.get(settings.split_policy, settings.split_policy)]
    if settings.chunk_size is not None:
        argv += ["--chunk-size", str(settings.chunk_size)]
    if settings.prefix_caching:
        argv.append("--prefix-caching")
    argv += ["--routing", settings.routing, "--quantization", settings.quantization,
             "--max-num-batched-tokens", str(settings.max_num_batched_tokens),
             "--max-num-seqs", str(settings.max_num_seqs),
             "--block-size", str(settings.block_size), "--dev-mode"]
    return argv


def plan_error(topology: Topology, model_path: str, devices_per_node: int,
               settings: RunSettings) -> str | None:
    """Why no plan can be built for these settings on this topology (None: it can)."""
    if topology.is_afd and settings.split_policy not in POLICY_TO_SPLIT:
        return f"split_policy={settings.split_policy!r} has no async_moe_split value"
    nodes = topology.nodes_needed(devices_per_node)
    options = LaunchOptions(
        model=model_path, devices_per_node=devices_per_node,
        node_addresses=tuple(f"{_CHECK_ADDRESS_BASE}{index + 1}" for index in range(nodes)),
        socket_ifname=_CHECK_NIC if nodes > 1 else None,
        split=POLICY_TO_SPLIT.get(settings.split_policy) if topology.is_afd else None,
        chunk_size=settings.chunk_size, prefix_caching=settings.prefix_caching,
        routing=settings.routing, quantization=settings.quantization,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_num_seqs=settings.max_num_seqs, block_size=settings.block_size, dev_mode=True)
    try:
        build_launch_plan(topology, options)
    except LaunchPlanError as error:
        return str(error)
    return None


def plan_document(topology: Topology, model_name: str, settings: RunSettings, *,
                  devices_per_node: int, environ: Mapping[str, str]) -> dict[str, Any]:
    """One deployment: its settings, node count and ``afd-launch-plan`` command line."""
    path = model_path_for(model_name, environ)
    return {
        "npu_topology": topology.canonical,
        "model": model_name,
        "model_path": path,
        "devices_per_node": devices_per_node,
        "nodes": topology.nodes_needed(devices_per_node),
        "settings": launch_key(settings),
        "afd_launch_plan": launch_plan_argv(topology, path, devices_per_node, settings),
        "plan_error": _joined(model_path_error(model_name, environ),
                              plan_error(topology, path, devices_per_node, settings)),
    }


def model_path_error(model_name: str, environ: Mapping[str, str]) -> str | None:
    """Why the plan has no real checkpoint path (None: ``$AFD_ASCEND_MODEL_PATH`` gives one).

    Without the variable the plan's ``--model`` is the harness's model name
    (``--afd-model``, e.g. ``reduced``), which no ``vllm serve`` can load: the plan
    would read as ready while it cannot start.
    """
    if environ.get(ENV_MODEL_PATH, "").strip():
        return None
    return (f"no model path: --model {model_name!r} is the harness's model name (--afd-model), "
            f"not a checkpoint; set ${ENV_MODEL_PATH} to the checkpoint path "
            "('{model}' is replaced by the model name)")


def _joined(*errors: str | None) -> str | None:
    present = [error for error in errors if error]
    return "; ".join(present) if present else None


def plan_facts(plan: Mapping[str, Any]) -> dict[str, Any]:
    """Manifest facts from an ``afd-launch-plan --json`` document."""
    processes = plan.get("processes") or []
    api = next((process for process in processes if not process.get("headless")), None)
    argv = list(api.get("argv", [])) if api else []
    facts: dict[str, Any] = {"devices_per_node": int(plan["devices_per_node"]),
                             "node_count": len(plan.get("nodes") or [])}
    if len(argv) > MODEL_ARGUMENT:  # vllm serve MODEL ...
        facts["model_path"] = argv[MODEL_ARGUMENT]
    quantization = flag_values(argv, "--quantization")
    facts["quantization"] = quantization[-1] if quantization else "none (no --quantization)"
    tokenizer_mode = flag_values(argv, "--tokenizer-mode")
    facts["tokenizer_mode"] = tokenizer_mode[-1] if tokenizer_mode else "auto"
    facts["execution_mode"] = EXECUTION_EAGER if has_flag(argv, "--enforce-eager") else EXECUTION_GRAPH
    return facts


def checkpoint_facts(path: str) -> dict[str, Any]:
    """Manifest facts from the checkpoint's ``config.json`` (layer count, quantization)."""
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return {}
    config = json.loads(config_file.read_text())
    facts: dict[str, Any] = {"tokenizer": path}
    if "num_hidden_layers" in config:
        facts["num_layers"] = config["num_hidden_layers"]
    if "quantization_config" in config:
        facts["quantization"] = config["quantization_config"]
    return facts


def read_plan(path_text: str, source: str) -> dict[str, Any]:
    try:
        plan = json.loads(Path(path_text).read_text())
        plan_facts(plan)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{source}: plan {path_text!r} is not an `afd-launch-plan --json` "
                         f"document ({type(error).__name__}: {error})") from None
    return plan
