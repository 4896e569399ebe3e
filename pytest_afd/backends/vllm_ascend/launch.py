"""Per-node launch plans for vLLM-Ascend (+ AFD plugin) from an NPU topology.

A plan is data: for every process, the node, the devices, the environment and
the ``vllm serve`` argument list. Nothing here builds a shell string by
concatenation; text meant for a person is quoted with :func:`shlex.join`.
Every invalid combination is rejected while the plan is built, before any
process is started (RFC: "unsupported combinations fail before communication
resources are created").

Flag, environment and ``--additional-config`` values follow the afd-plugin
DeepSeek V3.2 CAM async recipe, kept as data with its commit in
:mod:`~pytest_afd.backends.vllm_ascend.recipe`; every deviation is named there.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_afd.backends.vllm_ascend import recipe
from pytest_afd.topology import (
    DEFAULT_DEVICES_PER_NODE,
    RankInfo,
    RolePart,
    Topology,
    TopologyError,
    parse_topology,
)

CONNECTOR = "CAMAsyncAFDConnector"
# CAM async MoE ubatching supports exactly two stages.
ASYNC_MOE_NUM_UBATCHES = 2
# --split -> connector_extra_config.async_moe_split (None: no ubatching). "token" is
# the plugin's own (PR #180); "token_balanced" is afd_split's, registered by the
# afd_split vLLM general plugin (afd_split.integrations.afd_plugin).
SPLIT_TO_ASYNC_MOE = {"none": None, "request": "request", "token": "token",
                      "token_balanced": "token_balanced"}
POLICY_TO_SPLIT = {"none": "none", "request_boundary": "request",
                   "token_balanced": "token_balanced"}
SPLIT_TO_POLICY = {split: policy for policy, split in POLICY_TO_SPLIT.items()}
# The plugin's "token" is the plugin's, not afd_split's: it has no RunSettings policy.
PLUGIN_TOKEN_POLICY = "plugin_token"
AFD_SPLIT_PLUGIN = "afd_split"
# afd_split's integration regenerates no PCP stage metadata for a cut request
# yet, so it refuses prefill_context_parallel_size > 1 (the hook's PCP_REJECTION).
TOKEN_BALANCED_MAX_PCP = 1
PLACEHOLDER_ADDRESS = re.compile(r"^node\d+$")
ENV_ATTACH_URL = "AFD_ASCEND_SERVER_URL"
ENV_ATTACH_SETTINGS = "AFD_ASCEND_SERVER_SETTINGS"
# DeepSeek V3.2 routed experts; FFN ranks must divide them evenly (connector guide).
DEEPSEEK_V3_2_ROUTED_EXPERTS = 256
NATIVE_DBO_FLAGS = ("--enable-dbo", "--dbo-decode-token-threshold", "--dbo-prefill-token-threshold")
BATCHED_TOKENS_FLAG = "--max-num-batched-tokens"
MAX_PORT = 65535

# Recipe defaults.
DEFAULT_API_PORT = 8000
DEFAULT_FFN_API_PORT = 8001
DEFAULT_DP_RPC_PORT = 29550
DEFAULT_FFN_DP_RPC_PORT = 29551
DEFAULT_AFD_PORT = 1239
DEFAULT_MAX_NUM_BATCHED_TOKENS = 140_000
DEFAULT_MAX_MODEL_LEN = 70_000
# Per role, the recipe's --max-num-seqs and --gpu-memory-utilization (None: the recipe's).
RECIPE_MAX_NUM_SEQS = {"attention": int(recipe.ATTENTION_FLAGS["--max-num-seqs"]),
                       "ffn": int(recipe.FFN_FLAGS["--max-num-seqs"]),
                       "baseline": int(recipe.BASELINE_FLAGS["--max-num-seqs"])}
RECIPE_GPU_MEMORY_UTILIZATION = {
    "attention": float(recipe.ATTENTION_FLAGS["--gpu-memory-utilization"]),
    "ffn": float(recipe.ATTENTION_FLAGS["--gpu-memory-utilization"]),
    "baseline": float(recipe.BASELINE_FLAGS["--gpu-memory-utilization"]),
}
DEFAULT_BLOCK_SIZE = 128
DEFAULT_SEED = 1024
DEFAULT_SERVED_MODEL_NAME = "deepseek_v3_2"

ROLE_ATTENTION = "attention"
ROLE_FFN = "ffn"
ROLE_BASELINE = "baseline"


class LaunchPlanError(ValueError):
    """The requested deployment cannot work; nothing was started."""


@dataclass(frozen=True)
class LaunchOptions:
    """Run settings that shape the command lines (everything but the topology)."""

    model: str
    devices_per_node: int = DEFAULT_DEVICES_PER_NODE
    # The vLLM CLI: a name on PATH or a wrapper's path (e.g. one that enters the container).
    vllm_executable: str = "vllm"
    # Real addresses (IPs on multi-node: HCCL_IF_IP), one per node; no placeholders.
    node_addresses: tuple[str, ...] = ()
    # none | request | token | token_balanced; None: request for AFD, none otherwise.
    split: str | None = None
    chunk_size: int | None = None  # None: chunked prefill disabled
    prefix_caching: bool = False
    # natural | forced_balanced; the recipe measures with forced balancing (synthetic).
    routing: str = recipe.RECIPE_ROUTING
    quantization: str = "w8a8"  # w8a8 | none
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    # Attention / baseline --max-num-seqs (None: the recipe's 32 / 8); FFN: ffn_max_num_seqs.
    max_num_seqs: int | None = None
    ffn_max_num_seqs: int = RECIPE_MAX_NUM_SEQS["ffn"]
    block_size: int = DEFAULT_BLOCK_SIZE
    seed: int = DEFAULT_SEED
    served_model_name: str = DEFAULT_SERVED_MODEL_NAME
    gpu_memory_utilization: float | None = None  # None: the recipe's, per role
    stack: str = recipe.STACK_V019  # the vLLM / vLLM-Ascend line (v0.26: --tokenizer-mode)
    # NIC for GLOO/TP/HCCL_SOCKET_IFNAME; required when a plan spans nodes.
    socket_ifname: str | None = None
    cam_op_api_lib: str = recipe.CAM_OP_API_LIB
    api_port: int = DEFAULT_API_PORT
    ffn_api_port: int = DEFAULT_FFN_API_PORT
    dp_rpc_port: int = DEFAULT_DP_RPC_PORT
    ffn_dp_rpc_port: int = DEFAULT_FFN_DP_RPC_PORT
    afd_port: int = DEFAULT_AFD_PORT
    # Extra ``vllm serve`` arguments per role (attention/ffn/baseline), appended last.
    extra_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProcessPlan:
    """One ``vllm serve`` process on one node."""

    role: str
    node: int
    node_address: str
    devices: tuple[int, ...]
    dp_start_rank: int
    dp_local_size: int
    headless: bool
    api_port: int | None
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    # Path lists put in front of the launching environment's value (LD_LIBRARY_PATH).
    env_prepend: tuple[tuple[str, str], ...] = ()

    @property
    def num_ranks(self) -> int:
        return len(self.devices)

    def resolved_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """``env`` plus each prepended path list in front of ``environ``'s value."""
        resolved = dict(self.env)
        for key, prefix in self.env_prepend:
            current = environ.get(key, "")
            resolved[key] = f"{prefix}:{current}" if current else prefix
        return resolved

    def command_line(self) -> str:
        """The process as one shell line (``env K=V ... vllm serve ...``), values quoted."""
        prepends = [f"{shlex.quote(f'{key}={prefix}')}${{{key}:+:${key}}}"
                    for key, prefix in self.env_prepend]
        fixed = shlex.join(["env", *(f"{key}={value}" for key, value in self.env)])
        return " ".join([fixed, *prepends, shlex.join(self.argv)])

    def flag_values(self, flag: str) -> list[str]:
        return flag_values(self.argv, flag)

    def additional_config(self) -> dict[str, Any]:
        values = self.flag_values("--additional-config")
        return json.loads(values[-1]) if values else {}

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role, "node": self.node, "node_address": self.node_address,
            "devices": list(self.devices), "dp_start_rank": self.dp_start_rank,
            "dp_local_size": self.dp_local_size, "headless": self.headless,
            "api_port": self.api_port, "env": dict(self.env),
            "env_prepend": dict(self.env_prepend), "argv": list(self.argv),
            "command_line": self.command_line(),
        }


@dataclass(frozen=True)
class LaunchPlan:
    topology: str
    is_afd: bool
    devices_per_node: int
    node_addresses: tuple[str, ...]
    split: str
    processes: tuple[ProcessPlan, ...]
    # The RunSettings fields this deployment fixes: what a harness attaching to
    # it must declare in AFD_ASCEND_SERVER_SETTINGS.
    run_settings: Mapping[str, Any] = field(default_factory=dict)

    def by_role(self, role: str) -> list[ProcessPlan]:
        return [process for process in self.processes if process.role == role]

    def on_node(self, node: int) -> list[ProcessPlan]:
        return [process for process in self.processes if process.node == node]

    @property
    def api_process(self) -> ProcessPlan:
        """The process whose OpenAI API the benchmark client talks to."""
        serving_role = ROLE_ATTENTION if self.is_afd else ROLE_BASELINE
        return next(p for p in self.by_role(serving_role) if not p.headless)

    def to_json(self) -> dict[str, Any]:
        return {
            "topology": self.topology, "is_afd": self.is_afd,
            "devices_per_node": self.devices_per_node, "nodes": list(self.node_addresses),
            "split": self.split, "api": {"node": self.api_process.node_address,
                                         "port": self.api_process.api_port},
            "run_settings": dict(self.run_settings), "attach_env": self.attach_env(),
            "processes": [process.to_json() for process in self.processes],
        }

    def attach_env(self) -> dict[str, str]:
        """Environment for ``--afd-backend vllm-ascend`` to attach to this deployment."""
        api = self.api_process
        return {ENV_ATTACH_URL: f"http://{api.node_address}:{api.api_port}",
                ENV_ATTACH_SETTINGS: json.dumps(dict(self.run_settings), sort_keys=True)}

    def format_text(self) -> str:
        lines = [f"# {self.topology}: {len(self.processes)} processes on "
                 f"{len(self.node_addresses)} node(s), split={self.split}",
                 "# attach the harness with: "
                 + shlex.join([f"{key}={value}" for key, value in self.attach_env().items()])]
        for node, address in enumerate(self.node_addresses):
            lines.append(f"\n## node {node} ({address})")
            for process in self.on_node(node):
                mode = "headless" if process.headless else f"api port {process.api_port}"
                lines.append(
                    f"# {process.role}: devices {','.join(map(str, process.devices))}; "
                    f"DP ranks {process.dp_start_rank}..{process.dp_start_rank + process.dp_local_size - 1}; "
                    f"{mode}"
                )
                lines.append(process.command_line())
        return "\n".join(lines) + "\n"


# -- argv helpers -------------------------------------------------------------

def flag_values(argv: Sequence[str], flag: str) -> list[str]:
    """Values of ``flag`` in ``--flag value`` or ``--flag=value`` form, in order."""
    values = []
    for index, argument in enumerate(argv):
        if argument == flag and index + 1 < len(argv):
            values.append(argv[index + 1])
        elif argument.startswith(flag + "="):
            values.append(argument[len(flag) + 1:])
    return values


def has_flag(argv: Sequence[str], flag: str) -> bool:
    return any(argument == flag or argument.startswith(flag + "=") for argument in argv)


# -- role shapes --------------------------------------------------------------

@dataclass(frozen=True)
class _RoleShape:
    role: str
    dp: int
    tp: int
    pcp: int
    sequence_parallel: bool

    @property
    def ranks_per_replica(self) -> int:
        return self.tp * self.pcp


def _reject_dims(part: RolePart, role: str, dims: Sequence[str], why: str) -> None:
    for dim in dims:
        if part.size(dim) > 1:
            raise LaunchPlanError(f"{role} part {part.spec!r}: {dim}{part.size(dim)} {why}")


def _attention_shape(part: RolePart, role: str) -> _RoleShape:
    _reject_dims(part, role, ("cp",), "shares the TP group; vLLM-Ascend has no such flag (use pcp)")
    _reject_dims(part, role, ("dcp",), "is rejected by CAM async and not part of prefill launch plans")
    if role == ROLE_ATTENTION:
        _reject_dims(part, role, ("pp",), "is not supported with an AFD connector")
    else:
        _reject_dims(part, role, ("pp",), "needs a PP launch recipe, which is not frozen yet (Stage F)")
    tp = max(part.size("tp"), part.size("sp"))
    shape = _RoleShape(role, part.size("dp"), tp, part.size("pcp"), part.size("sp") > 1)
    ep = part.size("ep")
    if ep > 1 and ep != part.ranks:
        raise LaunchPlanError(
            f"{role} part {part.spec!r}: ep{ep} != its {part.ranks} ranks; vLLM's "
            "--enable-expert-parallel spreads experts over all dp*tp*pcp ranks"
        )
    return shape


def _ffn_shape(part: RolePart) -> _RoleShape:
    _reject_dims(part, ROLE_FFN, ("pcp", "dcp", "cp", "pp"), "has no meaning on the FFN side")
    tp = max(part.size("tp"), part.size("sp"))
    if part.ranks % tp:
        raise LaunchPlanError(f"ffn part {part.spec!r}: {part.ranks} ranks are not a multiple of tp{tp}")
    if DEEPSEEK_V3_2_ROUTED_EXPERTS % part.ranks:
        raise LaunchPlanError(
            f"ffn part {part.spec!r}: {DEEPSEEK_V3_2_ROUTED_EXPERTS} routed experts do not divide "
            f"evenly over {part.ranks} FFN ranks"
        )
    return _RoleShape(ROLE_FFN, part.ranks // tp, tp, 1, False)


# -- validation of options ----------------------------------------------------

def _resolve_split(options: LaunchOptions, topology: Topology, attention: _RoleShape) -> str:
    split = options.split if options.split is not None else ("request" if topology.is_afd else "none")
    if split not in SPLIT_TO_ASYNC_MOE:
        raise LaunchPlanError(f"split={split!r}; expected one of {tuple(SPLIT_TO_ASYNC_MOE)} "
                              "(cost_balanced has no async_moe_split value in the AFD plugin)")
    if not topology.is_afd and split != "none":
        raise LaunchPlanError(
            f"split={split!r} needs an AFD topology (<attention>-<ffn>); {topology.canonical!r} "
            "is co-located, where async MoE ubatching does not exist"
        )
    if split == "token" and (attention.tp <= 1 or attention.pcp > 1):
        raise LaunchPlanError(
            f"split='token' (the AFD plugin's own, PR #180) needs Attention TP > 1 and no PCP; "
            f"{topology.attention.spec!r} has tp{attention.tp} pcp{attention.pcp} "
            "(use split='request' there)"
        )
    if split == "token_balanced" and attention.pcp > TOKEN_BALANCED_MAX_PCP:
        raise LaunchPlanError(
            f"split='token_balanced' (afd_split's integration) does not support PCP yet: "
            f"{topology.attention.spec!r} has pcp{attention.pcp}; its stage PCP metadata is "
            "rebuilt from whole-request lengths, which a cut request breaks"
        )
    return split


def _check_addresses(addresses: Sequence[str], num_nodes: int, topology: Topology,
                     devices_per_node: int) -> None:
    """Real node addresses, one per node, IPs on multi-node plans (HCCL_IF_IP)."""
    if len(addresses) < num_nodes:
        raise LaunchPlanError(
            f"{topology.canonical} needs {topology.total_ranks} devices = {num_nodes} nodes of "
            f"{devices_per_node}, but {len(addresses)} node address(es) were given: "
            f"{list(addresses)}; pass --node-address once per node"
        )
    placeholders = [address for address in addresses if PLACEHOLDER_ADDRESS.match(address)]
    if placeholders:
        raise LaunchPlanError(f"node addresses {placeholders} are placeholders; give the nodes' "
                              "real addresses (--node-address)")
    if num_nodes > 1:
        for address in addresses[:num_nodes]:
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise LaunchPlanError(
                    f"node address {address!r} is not an IP address; multi-node plans export it "
                    f"as {recipe.HCCL_IF_IP}") from None


def _check_options(options: LaunchOptions) -> None:
    if options.devices_per_node < 1:
        raise LaunchPlanError(f"devices_per_node={options.devices_per_node}; expected >= 1")
    if options.stack not in recipe.STACKS:
        raise LaunchPlanError(f"stack={options.stack!r}; expected one of {recipe.STACKS}")
    if options.routing not in ("natural", "forced_balanced"):
        raise LaunchPlanError(f"routing={options.routing!r}; expected 'natural' or 'forced_balanced'")
    if options.quantization not in ("w8a8", "none"):
        raise LaunchPlanError(f"quantization={options.quantization!r}; expected 'w8a8' or 'none'")
    if options.chunk_size is not None:
        if options.chunk_size <= 0 or options.chunk_size % options.block_size:
            raise LaunchPlanError(
                f"chunk_size={options.chunk_size}: must be a positive multiple of the block size "
                f"{options.block_size} (page charging can exceed any other budget)"
            )
    elif options.max_num_batched_tokens < options.max_model_len:
        raise LaunchPlanError(
            f"max_num_batched_tokens={options.max_num_batched_tokens} < max_model_len="
            f"{options.max_model_len} with chunked prefill disabled: vLLM could never schedule a "
            "full-length prompt"
        )
    ports = (options.api_port, options.ffn_api_port, options.dp_rpc_port,
             options.ffn_dp_rpc_port, options.afd_port)
    if any(not 0 < port <= MAX_PORT for port in ports):
        raise LaunchPlanError(f"ports {ports}: each must be in 1..{MAX_PORT}")
    if len(set(ports)) != len(ports):
        raise LaunchPlanError(f"ports must be distinct (api, ffn api, dp rpc, ffn dp rpc, afd): {ports}")
    if len(set(options.node_addresses)) != len(options.node_addresses):
        raise LaunchPlanError(f"node addresses repeat: {options.node_addresses}")
    unknown_roles = sorted(set(options.extra_args) - {ROLE_ATTENTION, ROLE_FFN, ROLE_BASELINE})
    if unknown_roles:
        raise LaunchPlanError(f"extra_args for unknown roles {unknown_roles}")


# -- building -----------------------------------------------------------------

def _group_by_node(ranks: Sequence[RankInfo], shape: _RoleShape) -> list[tuple[int, list[RankInfo]]]:
    """(node, ranks) per node, checking that no DP replica straddles two nodes."""
    replicas: dict[int, set[int]] = {}
    for position, info in enumerate(ranks):
        replicas.setdefault(position // shape.ranks_per_replica, set()).add(info.node)
    for replica, nodes in replicas.items():
        if len(nodes) > 1:
            raise LaunchPlanError(
                f"{shape.role} DP replica {replica} ({shape.ranks_per_replica} ranks) would straddle "
                f"nodes {sorted(nodes)}; ranks must fit the nodes (choose --devices-per-node or a "
                "topology whose replicas pack whole into a node)"
            )
    by_node: dict[int, list[RankInfo]] = {}
    for info in ranks:
        by_node.setdefault(info.node, []).append(info)
    return sorted(by_node.items())


def _additional_config(topology: Topology, options: LaunchOptions, split: str, role: str,
                       afd_host: str, attention: _RoleShape) -> dict[str, Any]:
    """The baseline balances through enable_force_load_balance, AFD through its env variable."""
    config: dict[str, Any] = {}
    if not topology.is_afd:
        config["enable_force_load_balance"] = options.routing == "forced_balanced"
        return config
    extra: dict[str, Any] = {
        "dynamicQuant": int(options.quantization == "w8a8"),
        "attn_ranks_per_dp": attention.ranks_per_replica,
        "async_moe_ubatching": split != "none",
    }
    if split != "none":
        extra["async_moe_num_ubatches"] = ASYNC_MOE_NUM_UBATCHES
        extra["async_moe_split"] = SPLIT_TO_ASYNC_MOE[split]
    config["afd"] = {
        "role": role,
        "connector": CONNECTOR,
        "async": True,
        "host": afd_host,
        "port": options.afd_port,
        "num_attention_ranks": topology.attention_ranks,
        "num_ffn_ranks": topology.ffn_ranks,
        "compute_gate_on_attention": True,
        "connector_extra_config": extra,
    }
    return config


def _environment(topology: Topology, shape: _RoleShape, options: LaunchOptions, split: str,
                 devices: Sequence[int], node_address: str,
                 multi_node: bool) -> tuple[tuple[str, str], ...]:
    env = {
        **recipe.COMMON_ENV,
        "ASCEND_RT_VISIBLE_DEVICES": ",".join(map(str, devices)),
        "VLLM_USE_V1": "1",
    }
    if multi_node:
        env[recipe.HCCL_IF_IP] = node_address
        env.update(dict.fromkeys(recipe.SOCKET_IFNAME_VARIABLES, options.socket_ifname))
    if shape.pcp > 1 or (topology.is_afd and topology.attention.size("pcp") > 1):
        # The recipe exports it on every AFD process, FFN included.
        env.update(recipe.CONTEXT_PARALLEL_ENV)
    if shape.role != ROLE_FFN:
        # Exposes POST /reset_prefix_cache, which cold-cache phases need (RFC Stage B).
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if topology.is_afd:
        plugins = ["ascend", "afd"] + ([AFD_SPLIT_PLUGIN] if split == "token_balanced" else [])
        env["VLLM_PLUGINS"] = ",".join(plugins)
        env.update(recipe.AFD_ENV)
        env[recipe.AFD_FORCED_ROUTING_ENV] = str(int(options.routing == "forced_balanced"))
        # FlashComm1 (SP) only on Attention, and explicitly off on FFN (connector guide).
        sp_on = shape.role == ROLE_ATTENTION and shape.sequence_parallel
        env["VLLM_ASCEND_ENABLE_FLASHCOMM1"] = str(int(sp_on))
    else:
        env.update(recipe.BASELINE_ENV)
        if shape.sequence_parallel:
            env["VLLM_ASCEND_ENABLE_FLASHCOMM1"] = "1"
    return tuple(sorted(env.items()))


def _max_num_seqs(options: LaunchOptions, role: str) -> int:
    if role == ROLE_FFN:
        return options.ffn_max_num_seqs
    return options.max_num_seqs if options.max_num_seqs is not None else RECIPE_MAX_NUM_SEQS[role]


def _gpu_memory_utilization(options: LaunchOptions, role: str) -> float:
    if options.gpu_memory_utilization is not None:
        return options.gpu_memory_utilization
    return RECIPE_GPU_MEMORY_UTILIZATION[role]


def _role_processes(topology: Topology, options: LaunchOptions, split: str, shape: _RoleShape,
                    ranks: Sequence[RankInfo], addresses: Sequence[str], afd_host: str,
                    attention: _RoleShape, multi_node_plan: bool) -> list[ProcessPlan]:
    groups = _group_by_node(ranks, shape)
    multi_node = len(groups) > 1
    dp_address = addresses[groups[0][0]]
    api_port = options.ffn_api_port if shape.role == ROLE_FFN else options.api_port
    rpc_port = options.ffn_dp_rpc_port if shape.role == ROLE_FFN else options.dp_rpc_port
    batched_tokens = options.chunk_size if options.chunk_size is not None else options.max_num_batched_tokens
    config = _additional_config(topology, options, split, shape.role, afd_host, attention)
    processes = []
    dp_start = 0
    for position, (node, node_ranks) in enumerate(groups):
        headless = position > 0
        local_dp = len(node_ranks) // shape.ranks_per_replica
        argv = [options.vllm_executable, "serve", options.model]
        if not headless:
            argv += ["--host", "0.0.0.0", "--port", str(api_port)]
        argv += ["--served-model-name", options.served_model_name, "--enforce-eager",
                 "--tensor-parallel-size", str(shape.tp),
                 "--data-parallel-size", str(shape.dp)]
        if multi_node:
            argv += ["--data-parallel-size-local", str(local_dp),
                     "--data-parallel-start-rank", str(dp_start),
                     "--data-parallel-address", dp_address,
                     "--data-parallel-rpc-port", str(rpc_port)]
            if headless:
                argv.append("--headless")
        if shape.pcp > 1:
            argv += ["--prefill-context-parallel-size", str(shape.pcp)]
        argv += ["--enable-expert-parallel", "--block-size", str(options.block_size),
                 "--max-num-seqs", str(_max_num_seqs(options, shape.role)),
                 "--max-model-len", str(options.max_model_len),
                 BATCHED_TOKENS_FLAG, str(batched_tokens),
                 "--enable-chunked-prefill" if options.chunk_size is not None else "--no-enable-chunked-prefill",
                 "--enable-prefix-caching" if options.prefix_caching else "--no-enable-prefix-caching",
                 # usage.prompt_tokens_details.cached_tokens: realized hits per request.
                 "--enable-prompt-tokens-details",
                 "--seed", str(options.seed), "--trust-remote-code",
                 "--gpu-memory-utilization", str(_gpu_memory_utilization(options, shape.role))]
        if options.quantization == "w8a8":
            argv += ["--quantization", "ascend"]
        if options.stack in recipe.STACK_TOKENIZER_MODE:
            argv += [recipe.TOKENIZER_MODE_FLAG, recipe.STACK_TOKENIZER_MODE[options.stack]]
        argv += ["--additional-config", json.dumps(config, sort_keys=True)]
        argv += list(options.extra_args.get(shape.role, ()))
        devices = tuple(info.device for info in node_ranks)
        processes.append(ProcessPlan(
            role=shape.role, node=node, node_address=addresses[node], devices=devices,
            dp_start_rank=dp_start, dp_local_size=local_dp, headless=headless,
            api_port=None if headless else api_port, argv=tuple(argv),
            env=_environment(topology, shape, options, split, devices, addresses[node],
                             multi_node_plan),
            env_prepend=((recipe.LD_LIBRARY_PATH, options.cam_op_api_lib),) if topology.is_afd
            else (),
        ))
        dp_start += local_dp
    return processes


def _run_settings(options: LaunchOptions, split: str, serving_role: str) -> dict[str, Any]:
    return {
        "split_policy": SPLIT_TO_POLICY.get(split, PLUGIN_TOKEN_POLICY),
        "chunk_size": options.chunk_size,
        "prefix_caching": options.prefix_caching, "routing": options.routing,
        "quantization": options.quantization,
        "max_num_batched_tokens": options.max_num_batched_tokens,
        "max_num_seqs": _max_num_seqs(options, serving_role), "block_size": options.block_size,
    }


def build_launch_plan(topology: Topology | str, options: LaunchOptions) -> LaunchPlan:
    """The whole deployment for ``topology``; raises LaunchPlanError when it cannot work."""
    if isinstance(topology, str):
        try:
            topology = parse_topology(topology)
        except TopologyError as error:
            raise LaunchPlanError(str(error)) from error
    _check_options(options)
    attention_role = ROLE_ATTENTION if topology.is_afd else ROLE_BASELINE
    attention = _attention_shape(topology.attention, attention_role)
    split = _resolve_split(options, topology, attention)
    shapes = [attention] if topology.ffn is None else [attention, _ffn_shape(topology.ffn)]
    layout = topology.rank_layout(options.devices_per_node)
    num_nodes = max(info.node for info in layout) + 1
    addresses = options.node_addresses
    _check_addresses(addresses, num_nodes, topology, options.devices_per_node)
    if num_nodes > 1 and not options.socket_ifname:
        raise LaunchPlanError(
            f"{topology.canonical} spans {num_nodes} nodes: give the NIC the nodes talk over "
            f"(--nic-name) for {', '.join(recipe.SOCKET_IFNAME_VARIABLES)}"
        )
    afd_host = addresses[0]  # the node that owns Attention rank 0
    layout_roles = ("colocated",) if topology.ffn is None else (ROLE_ATTENTION, ROLE_FFN)
    processes: list[ProcessPlan] = []
    for shape, layout_role in zip(shapes, layout_roles, strict=True):
        ranks = [info for info in layout if info.role == layout_role]
        processes += _role_processes(topology, options, split, shape, ranks, addresses, afd_host,
                                     attention, num_nodes > 1)
    plan = LaunchPlan(topology=topology.canonical, is_afd=topology.is_afd,
                      devices_per_node=options.devices_per_node,
                      node_addresses=tuple(addresses[:num_nodes]), split=split,
                      processes=tuple(processes),
                      run_settings=_run_settings(options, split, attention_role))
    validate_plan(plan)
    return plan


# -- validation of a finished plan --------------------------------------------

def validate_plan(plan: LaunchPlan) -> None:
    """Cross-process checks on the final argument lists (extra args included)."""
    seen_devices: dict[tuple[int, int], ProcessPlan] = {}
    for process in plan.processes:
        for device in process.devices:
            if not 0 <= device < plan.devices_per_node:
                raise LaunchPlanError(f"{process.role} on node {process.node}: device {device} "
                                      f"outside 0..{plan.devices_per_node - 1}")
            owner = seen_devices.setdefault((process.node, device), process)
            if owner is not process:
                raise LaunchPlanError(f"node {process.node} device {device} assigned to both "
                                      f"{owner.role} and {process.role}")
    if not plan.is_afd:
        return
    for process in plan.processes:
        dbo = [flag for flag in NATIVE_DBO_FLAGS if has_flag(process.argv, flag)]
        if dbo:
            raise LaunchPlanError(
                f"{process.role} process on node {process.node} passes vLLM native DBO flags {dbo}; "
                f"{CONNECTOR} rejects native DBO (AFD async MoE ubatching replaces it)"
            )
        if not has_flag(process.argv, "--enforce-eager"):
            raise LaunchPlanError(f"{process.role} process on node {process.node}: {CONNECTOR} "
                                  "runs eager only; --enforce-eager is missing")
    limits = {(process.role, process.node): process.flag_values(BATCHED_TOKENS_FLAG)[-1:]
              for process in plan.processes}
    if len({tuple(value) for value in limits.values()}) != 1:
        raise LaunchPlanError(
            f"{BATCHED_TOKENS_FLAG} differs across AFD processes {limits}; async AFD needs the "
            "same value on every Attention and FFN process"
        )
    afd_objects = {json.dumps({key: value for key, value in process.additional_config()["afd"].items()
                               if key != "role"}, sort_keys=True) for process in plan.processes}
    if len(afd_objects) != 1:
        raise LaunchPlanError(f"the afd objects differ across processes beyond 'role': {sorted(afd_objects)}")


# -- CLI ----------------------------------------------------------------------

def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="afd-launch-plan",
        description="Print the per-node vLLM-Ascend launch plan for an NPU topology.")
    parser.add_argument("--npu-topology", required=True, help="e.g. dp3pcp8-ep8 or dp4pcp8")
    parser.add_argument("--model", required=True, help="checkpoint path on the nodes")
    parser.add_argument("--devices-per-node", type=int, default=DEFAULT_DEVICES_PER_NODE)
    parser.add_argument("--node-address", action="append", default=[], dest="node_addresses",
                        help="real address of node 0, 1, ... (repeat; IPs on multi-node)")
    parser.add_argument("--nic-name", default=None, dest="socket_ifname",
                        help="multi-node: NIC for GLOO/TP/HCCL_SOCKET_IFNAME")
    parser.add_argument("--stack", choices=recipe.STACKS, default=recipe.STACK_V019,
                        help="vLLM / vLLM-Ascend line (v0.26 adds --tokenizer-mode deepseek_v32)")
    parser.add_argument("--split", choices=tuple(SPLIT_TO_ASYNC_MOE), default=None,
                        help="async MoE split (AFD only); default request for AFD, none otherwise")
    parser.add_argument("--chunk-size", type=int, default=None,
                        help="enable chunked prefill with this token budget")
    parser.add_argument("--prefix-caching", action="store_true")
    parser.add_argument("--routing", choices=("natural", "forced_balanced"),
                        default=recipe.RECIPE_ROUTING,
                        help="default: the recipe's forced balancing (synthetic outputs)")
    parser.add_argument("--quantization", choices=("w8a8", "none"), default="w8a8")
    parser.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS)
    parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="Attention/baseline (default: the recipe's 32 / 8; FFN keeps 2)")
    for role in (ROLE_ATTENTION, ROLE_FFN, ROLE_BASELINE):
        parser.add_argument(f"--{role}-arg", action="append", default=[], dest=f"{role}_args",
                            metavar="ARG", help=f"extra vllm serve argument for {role} (repeat; "
                            f"use --{role}-arg=--flag=value)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser


def options_from_args(args: argparse.Namespace) -> LaunchOptions:
    extra = {role: tuple(getattr(args, f"{role}_args"))
             for role in (ROLE_ATTENTION, ROLE_FFN, ROLE_BASELINE) if getattr(args, f"{role}_args")}
    return LaunchOptions(
        model=args.model, devices_per_node=args.devices_per_node,
        node_addresses=tuple(args.node_addresses), split=args.split, chunk_size=args.chunk_size,
        prefix_caching=args.prefix_caching, routing=args.routing, quantization=args.quantization,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, extra_args=extra, stack=args.stack,
        socket_ifname=args.socket_ifname,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        plan = build_launch_plan(args.npu_topology, options_from_args(args))
    except LaunchPlanError as error:
        parser.exit(2, f"afd-launch-plan: error: {error}\n")
    text = json.dumps(plan.to_json(), indent=2) + "\n" if args.json else plan.format_text()
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `afd-launch-plan ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
