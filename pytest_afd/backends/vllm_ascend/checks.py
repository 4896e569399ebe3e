"""Fail-early checks of launch options and of finished plans (nothing is started first).

RFC: "unsupported combinations fail before communication resources are
created". Each check raises :class:`LaunchPlanError` naming the bad value.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Sequence

from pytest_afd.backends.model_fit import DEEPSEEK_V3_2, experts_error, heads_error
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
from pytest_afd.topology.spec import RolePart, Topology

# RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens.
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
MAX_HOSTNAME_CHARS = 253
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LOOPBACK_NAMES = ("localhost",)


def check_host(address: str) -> None:
    """An IP address or an RFC 1123 host name, else LaunchPlanError naming it.

    The address lands in the plan (``--host``, ``HCCL_IF_IP``, ``afd.host``,
    comments): a newline, a ``;`` or a space there is never an address.
    """
    try:
        ipaddress.ip_address(address)
        return
    except ValueError:
        pass
    labels = address.split(".")
    if (0 < len(address) <= MAX_HOSTNAME_CHARS and address.isascii()
            and all(_HOST_LABEL.fullmatch(label) for label in labels)
            and not labels[-1].isdigit()):
        return
    raise LaunchPlanError(f"node address {address!r} (--node-address) is neither an IP address "
                          "nor a host name (letters, digits, inner hyphens, dots)")


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address in LOOPBACK_NAMES


def check_api_key(options: LaunchOptions, api_addresses: Sequence[str]) -> None:
    """The API key comes from a named variable; only loopback APIs may run without one."""
    if options.api_key_env is None:
        exposed = [address for address in api_addresses if not is_loopback(address)]
        if exposed:
            raise LaunchPlanError(
                f"no API key for APIs bound to {exposed}: vLLM would serve every client that "
                "reaches them; give the key's variable (--api-key-env) or bind loopback")
        return
    if not _ENV_NAME.fullmatch(options.api_key_env):
        raise LaunchPlanError(f"api_key_env={options.api_key_env!r} (--api-key-env) is not an "
                              "environment variable name")

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
    for address in addresses:  # every one, on every plan: each lands in the plan's text
        check_host(address)
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


# -- role shapes ----------------------------------------------------------------

def _reject_dims(part: RolePart, role: str, dims: Sequence[str], why: str) -> None:
    for dim in dims:
        if part.size(dim) > 1:
            raise LaunchPlanError(f"{role} part {part.spec!r}: {dim}{part.size(dim)} {why}")


def attention_shape(part: RolePart, role: str) -> RoleShape:
    """The Attention (or baseline) role's shape; dims vLLM-Ascend cannot launch are refused."""
    _reject_dims(part, role, ("cp",), "shares the TP group; vLLM-Ascend has no such flag (use pcp)")
    _reject_dims(part, role, ("dcp",), "is rejected by CAM async and not part of prefill launch plans")
    if role == ROLE_ATTENTION:
        _reject_dims(part, role, ("pp",), "is not supported with an AFD connector")
    else:
        _reject_dims(part, role, ("pp",), "needs a PP launch recipe, which is not frozen yet (Stage F)")
    tp = max(part.size("tp"), part.size("sp"))
    error = heads_error(DEEPSEEK_V3_2, tp, f"{role} part {part.spec!r}")
    if error is not None:
        raise LaunchPlanError(error)
    shape = RoleShape(role, part.size("dp"), tp, part.size("pcp"), part.size("sp") > 1)
    ep = part.size("ep")
    if ep > 1 and ep != part.ranks:
        raise LaunchPlanError(
            f"{role} part {part.spec!r}: ep{ep} != its {part.ranks} ranks; vLLM's "
            "--enable-expert-parallel spreads experts over all dp*tp*pcp ranks"
        )
    return shape


def ffn_shape(part: RolePart) -> RoleShape:
    """The FFN role's shape: TP replicas over its ranks, which must hold whole experts."""
    _reject_dims(part, ROLE_FFN, ("pcp", "dcp", "cp", "pp"), "has no meaning on the FFN side")
    tp = max(part.size("tp"), part.size("sp"))
    if part.ranks % tp:
        raise LaunchPlanError(f"ffn part {part.spec!r}: {part.ranks} ranks are not a multiple of tp{tp}")
    error = experts_error(DEEPSEEK_V3_2, part.ranks, f"ffn part {part.spec!r}")
    if error is not None:  # the FFN ranks hold the experts, with or without an ep dim
        raise LaunchPlanError(error)
    return RoleShape(ROLE_FFN, part.ranks // tp, tp, 1, False)
