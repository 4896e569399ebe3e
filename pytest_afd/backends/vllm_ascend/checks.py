"""Fail-early checks of launch options and of finished plans (nothing is started first).

RFC: "unsupported combinations fail before communication resources are
created". Each check raises :class:`LaunchPlanError` naming the bad value.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence

from pytest_afd.backends.vllm_ascend import recipe
from pytest_afd.backends.vllm_ascend.plan import (
    BATCHED_TOKENS_FLAG,
    CONNECTOR,
    MAX_PORT,
    NATIVE_DBO_FLAGS,
    PLACEHOLDER_ADDRESS,
    ROLE_ATTENTION,
    ROLE_BASELINE,
    ROLE_FFN,
    SPLIT_TO_ASYNC_MOE,
    TOKEN_BALANCED_MAX_PCP,
    TOKEN_BALANCED_PCP_STACK,
    LaunchOptions,
    LaunchPlan,
    LaunchPlanError,
    ProcessPlan,
    RoleShape,
    has_flag,
)
from pytest_afd.topology import Topology

# -- validation of options ----------------------------------------------------

def resolve_split(options: LaunchOptions, topology: Topology, attention: RoleShape) -> str:
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
            f"split='token' (the AFD plugin's own, PR #203) needs Attention TP > 1 and no PCP; "
            f"{topology.attention.spec!r} has tp{attention.tp} pcp{attention.pcp} "
            "(use split='request' there)"
        )
    if (split == "token_balanced" and attention.pcp > TOKEN_BALANCED_MAX_PCP
            and options.stack != TOKEN_BALANCED_PCP_STACK):
        raise LaunchPlanError(
            f"split='token_balanced' with PCP ({topology.attention.spec!r} has "
            f"pcp{attention.pcp}) needs stack {TOKEN_BALANCED_PCP_STACK!r} (afd-plugin "
            f"release/v0.19.1rc1's per-stage PCP rebuild); stack {options.stack!r} has no PCP "
            "on model runner v1"
        )
    return split


def check_addresses(addresses: Sequence[str], num_nodes: int, topology: Topology,
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


def check_options(options: LaunchOptions) -> None:
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


