"""Launch plans as data: options, per-process plans, the plan, and argv helpers.

Split out of :mod:`~pytest_afd.backends.vllm_ascend.launch` (which builds
plans and re-exports these names) so each file keeps one job.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_afd.backends.vllm_ascend import recipe
from pytest_afd.topology.spec import DEFAULT_DEVICES_PER_NODE

CONNECTOR = "CAMAsyncAFDConnector"
# CAM async MoE ubatching supports exactly two stages.
ASYNC_MOE_NUM_UBATCHES = 2
# --split -> connector_extra_config.async_moe_split (None: no ubatching). "token" is
# the plugin's own (PR #203); "token_balanced" is afd_split's, registered by the
# afd_split vLLM general plugin (afd_split.hook.install).
SPLIT_TO_ASYNC_MOE = {"none": None, "request": "request", "token": "token",
                      "token_balanced": "token_balanced"}
POLICY_TO_SPLIT = {"none": "none", "request_boundary": "request",
                   "token_balanced": "token_balanced"}
SPLIT_TO_POLICY = {split: policy for policy, split in POLICY_TO_SPLIT.items()}
# The plugin's "token" is the plugin's, not afd_split's: it has no RunSettings policy.
PLUGIN_TOKEN_POLICY = "plugin_token"
AFD_SPLIT_PLUGIN = "afd_split"
# Splits the plugin plans itself, where afd_split is loaded on the Attention processes in
# evidence-only mode (afd_split.hook.patches.router wrapping afd_split.hook.glue.evidence_only):
# the plugin decides, the hook records step lines and expert load under AFD_EVIDENCE_DIR.
EVIDENCE_ONLY_SPLITS = ("none", "request")
# Beyond this PCP size token_balanced needs the v0.19.1rc1 stack: afd-plugin
# release/v0.19.1rc1 has the per-stage PCP rebuild the hook uses (its validator
# refuses PCP elsewhere, afd_split.hook.planning.rules); there each
# stage is laid out as its own zigzag, a cut request's rows moved between the PCP
# ranks (afd_split.pcp.relayout, the hook's forward patch).
TOKEN_BALANCED_MAX_PCP = 1
TOKEN_BALANCED_PCP_STACK = recipe.STACK_V019
PLACEHOLDER_ADDRESS = re.compile(r"^node\d+$")
ENV_ATTACH_URL = "AFD_ASCEND_SERVER_URL"
ENV_ATTACH_SETTINGS = "AFD_ASCEND_SERVER_SETTINGS"
NATIVE_DBO_FLAGS = ("--enable-dbo", "--dbo-decode-token-threshold", "--dbo-prefill-token-threshold")
BATCHED_TOKENS_FLAG = "--max-num-batched-tokens"
MAX_PORT = 65535
# The API key comes from the launching environment: the plan names the variable,
# never the key. vLLM checks it on /v1/* (its other routes stay open, so the dev
# routes are off unless asked for: LaunchOptions.dev_mode).
API_KEY_ENV = "VLLM_API_KEY"
API_KEY_FLAG = "--api-key"

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
    # The variable that holds the API key on the nodes (None: no key, loopback plans only).
    api_key_env: str | None = API_KEY_ENV
    # VLLM_SERVER_DEV_MODE=1 (POST /reset_prefix_cache for cold-cache phases): on request only.
    dev_mode: bool = False


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
    # (flag, variable): arguments whose value is read from the launching environment
    # (the API key), appended to argv there and never written into the plan.
    env_arguments: tuple[tuple[str, str], ...] = ()

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

    def resolved_argv(self, environ: Mapping[str, str]) -> tuple[str, ...]:
        """``argv`` plus each environment-valued argument; a missing variable is an error."""
        argv = list(self.argv)
        for flag, variable in self.env_arguments:
            value = environ.get(variable, "")
            if not value:
                raise LaunchPlanError(f"{self.role} on node {self.node}: {flag} reads ${variable}, "
                                      "which is not set in the launching environment")
            argv += [flag, value]
        return tuple(argv)

    def command_line(self) -> str:
        """The process as one shell line (``env K=V ... vllm serve ...``), values quoted.

        Environment-valued arguments stay references (``"${VLLM_API_KEY:?...}"``):
        the shell refuses to start the process when the variable is unset.
        """
        prepends = [f"{shlex.quote(f'{key}={prefix}')}${{{key}:+:${key}}}"
                    for key, prefix in self.env_prepend]
        fixed = shlex.join(["env", *(f"{key}={value}" for key, value in self.env)])
        from_env = [f'{shlex.quote(flag)} "${{{variable}:?set {variable} first}}"'
                    for flag, variable in self.env_arguments]
        return " ".join([fixed, *prepends, shlex.join(self.argv), *from_env])

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
            "env_arguments": [list(pair) for pair in self.env_arguments],
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
        """The plan as a shell script: commands quoted (shlex), comment text escaped."""
        lines = [comment(f"{self.topology}: {len(self.processes)} processes on "
                         f"{len(self.node_addresses)} node(s), split={self.split}"
                         f"{SPLIT_ROLES.get(self.split, '')}"),
                 comment("attach the harness with: "
                         + shlex.join([f"{key}={value}"
                                       for key, value in self.attach_env().items()]))]
        for node, address in enumerate(self.node_addresses):
            lines.append("\n" + comment(f"node {node} ({address})"))
            for process in self.on_node(node):
                mode = "headless" if process.headless else f"api port {process.api_port}"
                lines.append(comment(
                    f"{process.role}: devices {','.join(map(str, process.devices))}; "
                    f"DP ranks {process.dp_start_rank}..{process.dp_start_rank + process.dp_local_size - 1}; "
                    f"{mode}"
                ))
                lines.append(process.command_line())
        return "\n".join(lines) + "\n"


# What each split is in the RFC's study, for the plan's first line.
SPLIT_ROLES = {"none": " (no dual batching: the baseline)",
               "request": " (request-boundary split: the control; --split token_balanced for the "
                          "RFC's proposal)",
               "token_balanced": " (the RFC's token-balanced split)"}


def comment(text: str) -> str:
    """One shell comment line: control characters (a newline would end the comment and
    start a command) and non-ASCII are escaped, so the text stays inside the comment."""
    return "# " + text.encode("unicode_escape").decode("ascii")


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
class RoleShape:
    role: str
    dp: int
    tp: int
    pcp: int
    sequence_parallel: bool

    @property
    def ranks_per_replica(self) -> int:
        return self.tp * self.pcp


