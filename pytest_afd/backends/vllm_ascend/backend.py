"""The vLLM-Ascend backend: ``vllm serve`` processes driven over HTTP.

Two modes. *Launch*: the topology's launch plan fits this node, so the backend
starts every process itself (all at once, since Attention and FFN rendezvous),
waits for ``/health``, logs to the results directory and restarts the
deployment when a case needs other server-side settings. *Attach*: a
multi-node deployment started by the cluster's job system from the
``afd-launch-plan`` output; ``AFD_ASCEND_SERVER_URL`` names its API and
``AFD_ASCEND_SERVER_SETTINGS`` (RunSettings JSON) what it was started with, so a
case that needs different settings is refused instead of silently measured on
the wrong configuration.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_afd.backends.base import (
    CAP_AFD,
    CAP_CHUNKED_PREFILL,
    CAP_FORCED_ROUTING,
    CAP_PREFIX_CACHE,
    CAP_SPLIT,
    CAP_TOPK_LOGPROBS,
    CAP_W8A8,
    BackendUnavailable,
    CapabilityMissing,
    RunSettings,
)
from pytest_afd.backends.vllm_ascend.attach import (  # noqa: F401  (re-exported)
    ENV_SERVED_MODEL_NAME,
    attach_or_deploy,
    declared_settings,
    served_model_name,
)
from pytest_afd.backends.vllm_ascend.deployments import (
    ENV_DEPLOY_COMMAND,
    ENV_DEPLOYMENTS,
    LAUNCH_FIELDS,
)
from pytest_afd.backends.vllm_ascend.launch import (
    API_KEY_ENV,
    ENV_ATTACH_SETTINGS,
    ENV_ATTACH_URL,
    POLICY_TO_SPLIT,
    LaunchOptions,
    LaunchPlan,
    LaunchPlanError,
    build_launch_plan,
)
from pytest_afd.backends.vllm_ascend.listing import checkpoint_facts
from pytest_afd.backends.vllm_ascend.worker_evidence import WorkerEvidenceBackend
from pytest_afd.profiling import device_metrics
from pytest_afd.profiling.backend import ProfiledBackend
from pytest_afd.profiling.launch_profile import INSTRUMENT_FIELD, TRACE_ROOT_NAME, LaunchProfile
from pytest_afd.serving.http_backend import (
    HttpBackend,
    Launcher,
    ManagedSession,
)
from pytest_afd.serving.lifecycle import LOOPBACK_HOST, ServerGroup, ServerSpec
from pytest_afd.topology import Topology

BACKEND_NAME = "vllm-ascend"
ENV_SERVER_URL = ENV_ATTACH_URL
ENV_SERVER_SETTINGS = ENV_ATTACH_SETTINGS
ENV_MODEL_PATH = "AFD_ASCEND_MODEL_PATH"  # may contain "{model}" (the --afd-model name)
ENV_DEVICES_PER_NODE = "AFD_DEVICES_PER_NODE"
ENV_STARTUP_TIMEOUT = "AFD_ASCEND_STARTUP_TIMEOUT_S"
ENV_VLLM_EXECUTABLE = "AFD_ASCEND_VLLM"
# Loading a DeepSeek V3.2 W8A8 checkpoint and joining HCCL groups takes minutes.
DEFAULT_STARTUP_TIMEOUT_S = 1800.0
NPU_SMI = "npu-smi"
NPU_SMI_TIMEOUT_S = 30
_NPU_COUNT_LINE = re.compile(r"Total Count\s*:\s*(\d+)")
_NPU_PRODUCT_LINE = re.compile(r"Product Name\s*:\s*(\S.*?)\s*$", re.M)
REQUIRED_MODULES = ("vllm", "vllm_ascend", "torch_npu")
BASE_CAPABILITIES = frozenset({CAP_SPLIT, CAP_PREFIX_CACHE, CAP_CHUNKED_PREFILL, CAP_W8A8,
                               CAP_FORCED_ROUTING, CAP_TOPK_LOGPROBS})
HINT = (f"run the plan printed by `pytest-afd launch-plan` with the cluster job system and set "
        f"{ENV_SERVER_URL}=http://HOST:PORT (and {ENV_SERVER_SETTINGS}) to attach to it")


def capabilities_for(topology: Topology) -> frozenset[str]:
    """Top-k logprobs, but no logits, per-step evidence or instrumentation, cross the HTTP API."""
    return BASE_CAPABILITIES | ({CAP_AFD} if topology.is_afd else frozenset())


def missing_requirements(environ: Mapping[str, str]) -> list[str]:
    """Why processes cannot be launched on this machine (empty when they can)."""
    missing = []
    if shutil.which(NPU_SMI) is None:
        missing.append(f"`{NPU_SMI}` is not on PATH (no Ascend driver on this machine)")
    missing += [f"Python package {name} is not installed" for name in REQUIRED_MODULES
                if importlib.util.find_spec(name) is None]
    vllm = environ.get(ENV_VLLM_EXECUTABLE, "vllm")
    if shutil.which(vllm) is None:
        missing.append(f"the vLLM command {vllm!r} is not on PATH (set {ENV_VLLM_EXECUTABLE})")
    if not environ.get(ENV_MODEL_PATH):
        missing.append(f"{ENV_MODEL_PATH} (the W8A8 checkpoint directory) is not set")
    return missing


def npu_count_from_smi(text: str) -> int | None:
    """Device count from ``npu-smi info -l`` output (its "Total Count" line)."""
    match = _NPU_COUNT_LINE.search(text)
    return int(match.group(1)) if match else None


def npu_product_from_smi(text: str) -> str | None:
    """First "Product Name" of ``npu-smi info -l`` (the manifest's device type)."""
    match = _NPU_PRODUCT_LINE.search(text)
    return match.group(1) if match else None


def npu_smi_list() -> str:
    completed = subprocess.run([NPU_SMI, "info", "-l"], capture_output=True, text=True,
                               timeout=NPU_SMI_TIMEOUT_S, check=False)
    return completed.stdout + completed.stderr


def node_device_count(environ: Mapping[str, str], smi_text: str = "") -> int:
    if environ.get(ENV_DEVICES_PER_NODE):
        return int(environ[ENV_DEVICES_PER_NODE])
    count = npu_count_from_smi(smi_text)
    if count is None:
        raise BackendUnavailable(f"`{NPU_SMI} info -l` reported no device count: "
                                 f"{smi_text.strip()[:300]!r}")
    return count


def model_path(model_name: str, environ: Mapping[str, str]) -> str:
    return environ[ENV_MODEL_PATH].replace("{model}", model_name)


def launch_options(settings: RunSettings, *, model: str, devices: int,
                   overrides: Mapping[str, Any] | None = None) -> LaunchOptions:
    """RunSettings -> launch options for a single-node deployment on loopback.

    ``overrides`` sets further LaunchOptions fields (ports, the vLLM executable).
    """
    if settings.split_policy not in POLICY_TO_SPLIT:
        raise CapabilityMissing(f"split_policy={settings.split_policy!r} has no async_moe_split "
                                f"value in the AFD plugin (supported: {sorted(POLICY_TO_SPLIT)})")
    return LaunchOptions(
        model=model, devices_per_node=devices, node_addresses=(LOOPBACK_HOST,),
        split=POLICY_TO_SPLIT[settings.split_policy], chunk_size=settings.chunk_size,
        prefix_caching=settings.prefix_caching, routing=settings.routing,
        quantization=settings.quantization, max_num_batched_tokens=settings.max_num_batched_tokens,
        max_num_seqs=settings.max_num_seqs, block_size=settings.block_size,
        # The harness's own loopback deployment: no API key, and the dev routes on for
        # POST /reset_prefix_cache (cold-cache phases). Both bind 127.0.0.1 only.
        api_key_env=None, dev_mode=True,
        **dict(overrides or {}),
    )


def server_specs(plan: LaunchPlan, *, startup_timeout_s: float) -> list[ServerSpec]:
    """One spec per plan process; headless DP workers have no HTTP endpoint to poll."""
    specs = []
    for index, process in enumerate(plan.processes):
        specs.append(ServerSpec(
            name=f"{index}-{process.role}-node{process.node}",
            argv=process.resolved_argv(os.environ), env=process.resolved_env(os.environ),
            port=process.api_port,
            health_path=None if process.headless else "/health",
            startup_timeout_s=startup_timeout_s,
        ))
    return specs


def local_launcher(topology: Topology, *, model: str, devices: int, log_dir: Path,
                   startup_timeout_s: float, overrides: Mapping[str, Any] | None = None,
                   profile: LaunchProfile | None = None) -> Launcher:
    """``profile``: the instrumented run's deployment gets the plugin profiler's variables
    with the schedule computed for the case (docs/profiling.md)."""
    def launch(settings: RunSettings) -> ManagedSession:
        try:
            options = launch_options(settings, model=model, devices=devices, overrides=overrides)
            plan = build_launch_plan(topology, options)
            if profile is not None:
                plan = profile.plan_for(plan, settings)
        except LaunchPlanError as error:
            raise CapabilityMissing(f"{topology.canonical} cannot run these settings: {error}") from error
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / "launch-plan.json").write_text(json.dumps(plan.to_json(), indent=2))
        group = ServerGroup(server_specs(plan, startup_timeout_s=startup_timeout_s), log_dir).start()
        api = plan.api_process
        return ManagedSession(server=group, base_url=f"http://{LOOPBACK_HOST}:{api.api_port}",
                              model=api.flag_values("--served-model-name")[-1])

    return launch


def create_backend(*, topology: Topology, model_name: str, seed: int, results_dir: str | Path,
                   environ: Mapping[str, str] | None = None,
                   devices_per_node: int | None = None) -> HttpBackend | WorkerEvidenceBackend:
    """``devices_per_node``: the user's ``--afd-devices-per-node`` (None: ``$AFD_DEVICES_PER_NODE``,
    then ``npu-smi`` when launching; a deploy command needs one of the first two)."""
    environ = os.environ if environ is None else environ
    describe: dict[str, Any] = {"model": {"name": model_name}, "seed": seed,
                                "topology": topology.canonical}
    api_key = None
    if environ.get(ENV_SERVER_URL) or environ.get(ENV_DEPLOYMENTS) or environ.get(ENV_DEPLOY_COMMAND):
        # A cluster deployment's API key, from the variable its plan reads (never logged).
        api_key = environ.get(API_KEY_ENV) or None
        launcher, facts = attach_or_deploy(topology, model_name, environ, results_dir,
                                           devices_per_node=devices_per_node)
        describe.update(facts)
        describe["model"] = {"name": model_name, **facts.get("model", {})}
    else:
        missing = missing_requirements(environ)
        if missing:
            raise BackendUnavailable(f"{BACKEND_NAME}: cannot launch servers here: "
                                     f"{'; '.join(missing)}. Or {HINT}.")
        smi_text = npu_smi_list()
        devices = devices_per_node or node_device_count(environ, smi_text)
        device_type = npu_product_from_smi(smi_text)
        if device_type is not None:
            describe["device_type"] = device_type
        nodes = topology.nodes_needed(devices)
        if nodes > 1:
            raise BackendUnavailable(
                f"{BACKEND_NAME}: {topology.canonical} needs {nodes} nodes of {devices} NPUs and "
                f"this backend launches single-node plans only; {HINT}")
        path = model_path(model_name, environ)
        describe.update(mode="launch", model_path=path, devices_per_node=devices,
                        node_count=nodes)
        describe["model"].update(checkpoint_facts(path))
        timeout = float(environ.get(ENV_STARTUP_TIMEOUT, DEFAULT_STARTUP_TIMEOUT_S))
        overrides = {"vllm_executable": environ[ENV_VLLM_EXECUTABLE]} if environ.get(ENV_VLLM_EXECUTABLE) else {}
        profile = LaunchProfile(Path(results_dir) / TRACE_ROOT_NAME)
        launcher = local_launcher(topology, model=path, devices=devices,
                                  log_dir=Path(results_dir) / "servers", startup_timeout_s=timeout,
                                  overrides=overrides, profile=profile)
    launch_mode = describe.get("mode") == "launch"
    # Launch mode: the instrumented run is served by its own, profiled deployment.
    fields = LAUNCH_FIELDS + ((INSTRUMENT_FIELD,) if launch_mode else ())
    backend = HttpBackend(BACKEND_NAME, capabilities_for(topology), launcher,
                          describe_extra=describe, server_fields=fields, api_key=api_key)
    # With AFD_EVIDENCE_DIR set (inherited by launched servers; set on both sides when
    # attaching), each case's steps and expert load come from the Attention ranks' lines.
    wrapped = WorkerEvidenceBackend.wrap_from_env(backend, environ)
    # With AFD_PROFILE_TRACE_DIRS set, instrumented runs come back with their profile
    # (docs/profiling.md); launch mode samples this node's NPUs during measured runs.
    sampler = (device_metrics.Sampler.available(device_metrics.layout_devices(topology, devices))
               if launch_mode else None)
    if launch_mode:  # the harness applies the profiler schedule itself
        return ProfiledBackend(wrapped, profile.trace_dirs(), environ=environ, sampler=sampler,
                               launch=profile)
    return ProfiledBackend.wrap_from_env(wrapped, environ, sampler=sampler)
