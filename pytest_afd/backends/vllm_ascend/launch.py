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
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from afd_split.hook.planning.threshold import NO_THRESHOLD, SPLIT_MIN_TOKENS_ENV
from pytest_afd.backends.vllm_ascend import launch_gates, recipe
from pytest_afd.backends.vllm_ascend.checks import (
    attention_shape,
    check_addresses,
    check_api_key,
    check_options,
    ffn_shape,
    resolve_split,
    validate_plan,
)
from pytest_afd.backends.vllm_ascend.plan import (  # noqa: F401  (re-exported)
    AFD_SPLIT_PLUGIN,
    API_KEY_ENV,
    API_KEY_FLAG,
    ASYNC_MOE_NUM_UBATCHES,
    BATCHED_TOKENS_FLAG,
    CONNECTOR,
    DEFAULT_AFD_PORT,
    DEFAULT_API_PORT,
    DEFAULT_MAX_MODEL_LEN,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    ENV_ATTACH_SETTINGS,
    ENV_ATTACH_URL,
    EVIDENCE_ONLY_SPLITS,
    NATIVE_DBO_FLAGS,
    PLUGIN_TOKEN_POLICY,
    POLICY_TO_SPLIT,
    RECIPE_GPU_MEMORY_UTILIZATION,
    RECIPE_MAX_NUM_SEQS,
    ROLE_ATTENTION,
    ROLE_BASELINE,
    ROLE_FFN,
    SPLIT_TO_ASYNC_MOE,
    SPLIT_TO_POLICY,
    LaunchOptions,
    LaunchPlan,
    LaunchPlanError,
    ProcessPlan,
    RoleShape,
    flag_values,
    has_flag,
)
from pytest_afd.profiling import cli_launch as profile_cli
from pytest_afd.topology.spec import (
    DEFAULT_DEVICES_PER_NODE,
    RankInfo,
    Topology,
    TopologyError,
    parse_topology,
)

PROG = "afd-launch-plan"  # the old console script's name; pytest-afd launch-plan passes its own

# -- building -----------------------------------------------------------------

def _group_by_node(ranks: Sequence[RankInfo], shape: RoleShape) -> list[tuple[int, list[RankInfo]]]:
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
                       afd_host: str, attention: RoleShape) -> dict[str, Any]:
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


def _environment(topology: Topology, shape: RoleShape, options: LaunchOptions, split: str,
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
    if shape.role != ROLE_FFN and options.dev_mode:
        # Exposes POST /reset_prefix_cache, which cold-cache phases need (RFC Stage B), and
        # vLLM's other dev routes, unauthenticated: on request only (--dev-mode).
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if topology.is_afd:
        env["VLLM_PLUGINS"] = ",".join(_general_plugins(split, shape.role))
        env.update(recipe.AFD_ENV)
        if split == "token_balanced" and shape.role == ROLE_ATTENTION:
            # The harness tests the split path: every step the plan can split is split,
            # tiny gate batches included (the deployed default leaves short steps unsplit,
            # afd_split.hook.planning.threshold), so a green case means split steps ran.
            env[SPLIT_MIN_TOKENS_ENV] = str(NO_THRESHOLD)
        env[recipe.AFD_FORCED_ROUTING_ENV] = str(int(options.routing == "forced_balanced"))
        # FlashComm1 (SP) only on Attention, and explicitly off on FFN (connector guide).
        sp_on = shape.role == ROLE_ATTENTION and shape.sequence_parallel
        env["VLLM_ASCEND_ENABLE_FLASHCOMM1"] = str(int(sp_on))
    else:
        env.update(recipe.BASELINE_ENV)
        if shape.sequence_parallel:
            env["VLLM_ASCEND_ENABLE_FLASHCOMM1"] = "1"
    return tuple(sorted(env.items()))


def _general_plugins(split: str, role: str) -> list[str]:
    """``VLLM_PLUGINS`` of an AFD process: afd_split plans token_balanced everywhere, and
    records the plugin's own none/request steps on Attention (evidence-only mode)."""
    hooked = split == "token_balanced" or (split in EVIDENCE_ONLY_SPLITS
                                           and role == ROLE_ATTENTION)
    return ["ascend", "afd"] + ([AFD_SPLIT_PLUGIN] if hooked else [])


def _max_num_seqs(options: LaunchOptions, role: str) -> int:
    if role == ROLE_FFN:
        return options.ffn_max_num_seqs
    return options.max_num_seqs if options.max_num_seqs is not None else RECIPE_MAX_NUM_SEQS[role]


def _gpu_memory_utilization(options: LaunchOptions, role: str) -> float:
    if options.gpu_memory_utilization is not None:
        return options.gpu_memory_utilization
    return RECIPE_GPU_MEMORY_UTILIZATION[role]


def _role_processes(topology: Topology, options: LaunchOptions, split: str, shape: RoleShape,
                    ranks: Sequence[RankInfo], addresses: Sequence[str], afd_host: str,
                    attention: RoleShape, multi_node_plan: bool) -> list[ProcessPlan]:
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
            # The node's own address, not every interface.
            argv += ["--host", addresses[node], "--port", str(api_port)]
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
            env_arguments=((API_KEY_FLAG, options.api_key_env),)
            if options.api_key_env is not None and not headless else (),
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
    check_options(options)
    attention_role = ROLE_ATTENTION if topology.is_afd else ROLE_BASELINE
    attention = attention_shape(topology.attention, attention_role)
    split = resolve_split(options, topology, attention)
    shapes = [attention] if topology.ffn is None else [attention, ffn_shape(topology.ffn)]
    layout = topology.rank_layout(options.devices_per_node)
    num_nodes = max(info.node for info in layout) + 1
    addresses = options.node_addresses
    check_addresses(addresses, num_nodes, topology, options.devices_per_node)
    if num_nodes > 1 and not options.socket_ifname:
        raise LaunchPlanError(
            f"{topology.canonical} spans {num_nodes} nodes: give the NIC the nodes talk over "
            f"(--nic-name) for {', '.join(recipe.SOCKET_IFNAME_VARIABLES)}"
        )
    check_api_key(options, addresses[:num_nodes])
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


# -- CLI ----------------------------------------------------------------------

def _build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Print the per-node vLLM-Ascend launch plan for an NPU topology.")
    parser.add_argument("--npu-topology", required=True, help="e.g. dp3pcp8-ep8 or dp4pcp8")
    parser.add_argument("--model", required=True, help="checkpoint path on the nodes")
    parser.add_argument("--devices-per-node", type=int, default=DEFAULT_DEVICES_PER_NODE,
                        help="NPUs per node (default %(default)s)")
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
    parser.add_argument("--prefix-caching", action="store_true",
                        help="enable prefix caching (default: off)")
    parser.add_argument("--routing", choices=("natural", "forced_balanced"),
                        default=recipe.RECIPE_ROUTING,
                        help="default: the recipe's forced balancing (synthetic outputs)")
    parser.add_argument("--quantization", choices=("w8a8", "none"), default="w8a8",
                        help="weight quantization (default %(default)s, the recipe's)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
                        help="tokens per scheduler step (default %(default)s)")
    parser.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN,
                        help="longest sequence served (default %(default)s)")
    parser.add_argument("--block-size", type=int, default=LaunchOptions.block_size,
                        help="KV block size (default %(default)s)")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="Attention/baseline (default: the recipe's 32 / 8; FFN keeps 2)")
    for role in (ROLE_ATTENTION, ROLE_FFN, ROLE_BASELINE):
        parser.add_argument(f"--{role}-arg", action="append", default=[], dest=f"{role}_args",
                            metavar="ARG", help=f"extra vllm serve argument for {role} (repeat; "
                            f"use --{role}-arg=--flag=value)")
    parser.add_argument("--api-key-env", default=API_KEY_ENV,
                        help="variable holding the API key on the nodes; the plan passes "
                             '--api-key "$VAR", never the key (default %(default)s)')
    parser.add_argument("--no-api-key", action="store_true",
                        help="no API key (refused unless the API binds a loopback address)")
    parser.add_argument("--dev-mode", action="store_true",
                        help="set VLLM_SERVER_DEV_MODE=1 on the serving role: POST "
                             "/reset_prefix_cache for cold-cache phases (unauthenticated)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--for-gates", action="store_true",
                        help="the two deployments pytest -m gate runs its split path on (the "
                             "gates' settings; token_balanced and the split-none reference)")
    profile_cli.add_arguments(parser)  # --profile: docs/profiling.md
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
        block_size=args.block_size,
        socket_ifname=args.socket_ifname,
        api_key_env=None if args.no_api_key else args.api_key_env, dev_mode=args.dev_mode,
    )


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """``pytest-afd launch-plan`` (``prog``) and the old ``afd-launch-plan`` script."""
    parser = _build_parser(prog)
    args = parser.parse_args(argv)
    try:
        if args.for_gates:  # docs/gates.md "Attached gates"
            plans = launch_gates.gate_plans(args.npu_topology, options_from_args(args),
                                            build_launch_plan)
        else:
            plan = build_launch_plan(args.npu_topology, options_from_args(args))
            plan = profile_cli.profiled_plan(plan, args, LaunchPlanError)
    except LaunchPlanError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if args.for_gates:
        text = launch_gates.format_json(plans) if args.json else launch_gates.format_text(plans)
    else:
        text = json.dumps(plan.to_json(), indent=2) + "\n" if args.json else plan.format_text()
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:  # `afd-launch-plan ... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
