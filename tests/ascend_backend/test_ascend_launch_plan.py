"""Launch plans for the DeepSeek V3.2 CAM async recipe layouts, and fail-early validation."""

import dataclasses
import json
import shlex
import subprocess
import sys

import pytest

from pytest_afd.backends.vllm_ascend.launch import (
    LaunchOptions,
    LaunchPlanError,
    build_launch_plan,
    flag_values,
    main,
    validate_plan,
)
from pytest_afd.core.backend import RunSettings

MODEL = "/models/DeepSeek-V3.2-W8A8"
RECIPE_NODES = ("10.0.0.1", "10.0.0.2")
NIC = "eth0"


def recipe_options(**changes):
    values = {"devices_per_node": 16, "node_addresses": RECIPE_NODES, "socket_ifname": NIC,
              **changes}
    return LaunchOptions(model=MODEL, **values)


def single(values):
    assert len(values) == 1, values
    return values[0]


def test_afd_dp3pcp8_ep8_matches_recipe_shape():
    plan = build_launch_plan("dp3pcp8-ep8", recipe_options())
    assert plan.is_afd and plan.split == "request"
    node0, node1 = plan.on_node(0), plan.on_node(1)
    # Node 0: Attention DP0-DP1 on all 16 devices, serving the API.
    assert [(p.role, p.devices, p.dp_start_rank, p.dp_local_size, p.headless) for p in node0] == [
        ("attention", tuple(range(16)), 0, 2, False)]
    # Node 1: Attention DP2 (devices 0-7, headless) and FFN EP8 (devices 8-15).
    assert [(p.role, p.devices, p.dp_start_rank, p.dp_local_size, p.headless) for p in node1] == [
        ("attention", tuple(range(8)), 2, 1, True), ("ffn", tuple(range(8, 16)), 0, 8, False)]
    attention0, attention1, ffn = plan.processes
    for process in (attention0, attention1):
        assert single(process.flag_values("--data-parallel-size")) == "3"
        assert single(process.flag_values("--prefill-context-parallel-size")) == "8"
        assert single(process.flag_values("--tensor-parallel-size")) == "1"
        assert single(process.flag_values("--data-parallel-address")) == RECIPE_NODES[0]
        assert dict(process.env)["VLLM_ASCEND_ENABLE_CONTEXT_PARALLEL"] == "1"
        assert "VLLM_SERVER_DEV_MODE" not in dict(process.env)  # dev routes: --dev-mode only
    assert single(attention1.flag_values("--data-parallel-start-rank")) == "2"
    assert "--headless" in attention1.argv and "--port" not in attention1.argv
    assert single(ffn.flag_values("--data-parallel-size")) == "8"
    assert not ffn.flag_values("--prefill-context-parallel-size")
    assert dict(ffn.env)["ASCEND_RT_VISIBLE_DEVICES"] == "8,9,10,11,12,13,14,15"
    assert plan.api_process is attention0
    # Identical batched-token limit on both roles (async AFD requirement).
    assert {single(p.flag_values("--max-num-batched-tokens")) for p in plan.processes} == {"140000"}
    for process in plan.processes:
        assert "--no-enable-chunked-prefill" in process.argv
        assert "--no-enable-prefix-caching" in process.argv
        assert "--enforce-eager" in process.argv
        afd = process.additional_config()["afd"]
        assert afd["role"] == process.role
        assert (afd["num_attention_ranks"], afd["num_ffn_ranks"]) == (24, 8)
        assert afd["host"] == RECIPE_NODES[0] and afd["async"] is True
        assert afd["connector"] == "CAMAsyncAFDConnector" and afd["compute_gate_on_attention"] is True
        assert afd["connector_extra_config"] == {
            "dynamicQuant": 1, "attn_ranks_per_dp": 8, "async_moe_ubatching": True,
            "async_moe_num_ubatches": 2, "async_moe_split": "request"}


def test_baseline_dp4pcp8_matches_recipe_shape():
    plan = build_launch_plan("dp4pcp8", recipe_options(routing="forced_balanced"))
    assert not plan.is_afd and plan.split == "none"
    assert [(p.role, p.node, p.devices, p.dp_start_rank, p.dp_local_size, p.headless)
            for p in plan.processes] == [
        ("baseline", 0, tuple(range(16)), 0, 2, False), ("baseline", 1, tuple(range(16)), 2, 2, True)]
    for process in plan.processes:
        assert single(process.flag_values("--data-parallel-size")) == "4"
        assert single(process.flag_values("--prefill-context-parallel-size")) == "8"
        assert process.additional_config() == {"enable_force_load_balance": True}
        assert "VLLM_PLUGINS" not in dict(process.env)


def test_token_split_and_chunking_reach_every_role():
    plan = build_launch_plan("dp2tp8-ep16", recipe_options(split="token", chunk_size=16384,
                                                           prefix_caching=True))
    for process in plan.processes:
        assert process.additional_config()["afd"]["connector_extra_config"]["async_moe_split"] == "token"
        assert single(process.flag_values("--max-num-batched-tokens")) == "16384"
        assert "--enable-chunked-prefill" in process.argv and "--enable-prefix-caching" in process.argv
        assert "--enable-prompt-tokens-details" in process.argv


def test_sequence_parallel_turns_flashcomm_on_attention_only():
    plan = build_launch_plan("dp2sp8-ep16", recipe_options(split="token"))
    by_role = {p.role: dict(p.env)["VLLM_ASCEND_ENABLE_FLASHCOMM1"] for p in plan.processes}
    assert by_role == {"attention": "1", "ffn": "0"}
    attention = plan.by_role("attention")[0]
    assert single(attention.flag_values("--tensor-parallel-size")) == "8"


def test_command_line_is_shell_quoted_and_round_trips():
    plan = build_launch_plan("dp3pcp8-ep8", recipe_options())
    process = plan.processes[0]
    words = shlex.split(process.command_line())
    assert words[0] == "env"
    assert words[words.index("vllm"):] == [*process.argv, "--api-key",
                                           "${VLLM_API_KEY:?set VLLM_API_KEY first}"]
    # The CAM operator library goes in front of whatever LD_LIBRARY_PATH the node has.
    run = subprocess.run(["bash", "-c", process.command_line().split(" vllm ")[0] + " printenv "
                          "LD_LIBRARY_PATH"], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/opt/x"})
    assert run.stdout.strip() == "/usr/local/Ascend/cann-8.5.1/opp/vendors/CAM/op_api/lib:/opt/x"
    assert json.loads(single(flag_values(words, "--additional-config"))) == process.additional_config()


@pytest.mark.parametrize(
    ("topology", "changes", "message"),
    [
        ("dp3pcp8-ep8", {"devices_per_node": 12,
                         "node_addresses": ("10.0.0.1", "10.0.0.2", "10.0.0.3")}, "straddle"),
        ("dp3pcp8-ep8", {"node_addresses": ("10.0.0.1",)}, "1 node address"),
        ("dp3pcp8-ep8", {"node_addresses": ()}, "0 node address"),
        ("dp3pcp8-ep8", {"node_addresses": ("node0", "node1")}, "placeholders"),
        ("dp3pcp8-ep8", {"node_addresses": ("head", "worker")}, "not an IP address"),
        ("dp3pcp8-ep8", {"socket_ifname": None}, "--nic-name"),
        ("dp3pcp8-ep8", {"split": "token"}, "needs Attention TP > 1 and no PCP"),
        ("dp2pcp2tp4-ep8", {"split": "token"}, "no PCP"),
        ("dp3pcp8-ep8", {"split": "token_balanced", "stack": "v0.26"},
         "needs stack 'v0.19.1rc1'"),
        ("dp3pcp8-ep8", {"stack": "v0.20"}, "stack"),
        ("dp3pcp8-ep8", {"extra_args": {"attention": ("--enable-dbo",)}}, "native DBO"),
        ("dp3pcp8-ep8", {"extra_args": {"ffn": ("--dbo-prefill-token-threshold=512",)}}, "native DBO"),
        ("dp3pcp8-ep8", {"extra_args": {"ffn": ("--max-num-batched-tokens=8192",)}}, "differs across AFD"),
        ("dp3pcp8-ep8", {"split": "cost_balanced"}, "cost_balanced"),
        ("dp4pcp8", {"split": "token"}, "needs an AFD topology"),
        ("dp4-ep8", {"split": "token"}, "tp1 pcp1"),
        ("dp3pcp8-ep7", {}, "cannot be spread evenly over 7 EP ranks"),
        ("dp3tp3-ep8", {}, "128 attention heads cannot be sharded evenly over tp3"),
        ("dp3pcp8-ep8", {"chunk_size": 1000}, "multiple of the block size"),
        ("dp3pcp8-ep8", {"max_num_batched_tokens": 8192}, "max_model_len"),
        ("dp3pcp8-ep8", {"afd_port": 8000}, "distinct"),
        ("pp2cp8tp8", {}, "cp8"),
        ("dp2pcp8pp2-ep8", {}, "pp2"),
        ("dp3pcp8-ep8x", {}, "unknown token"),
    ],
)
def test_invalid_combinations_fail_before_anything_starts(topology, changes, message):
    with pytest.raises(LaunchPlanError, match=message):
        build_launch_plan(topology, recipe_options(**changes))


def test_validate_plan_rejects_an_edited_plan():
    plan = build_launch_plan("dp3pcp8-ep8", recipe_options())
    ffn_index = 2
    ffn = plan.processes[ffn_index]
    edited_argv = tuple("8192" if value == "140000" else value for value in ffn.argv)
    edited = dataclasses.replace(
        plan, processes=(*plan.processes[:ffn_index], dataclasses.replace(ffn, argv=edited_argv)))
    with pytest.raises(LaunchPlanError, match="--max-num-batched-tokens differs"):
        validate_plan(edited)
    overlapping = dataclasses.replace(
        plan, processes=(*plan.processes[:ffn_index], dataclasses.replace(ffn, devices=(7, 8))))
    with pytest.raises(LaunchPlanError, match="device 7 assigned to both"):
        validate_plan(overlapping)


NODE_ARGS = ["--node-address", RECIPE_NODES[0], "--node-address", RECIPE_NODES[1],
             "--nic-name", NIC]


def test_cli_prints_plan_and_json(capsys):
    assert main(["--npu-topology", "dp3pcp8-ep8", "--devices-per-node", "16", "--model", MODEL,
                 *NODE_ARGS, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["split"] == "request" and payload["nodes"] == list(RECIPE_NODES)
    assert [p["role"] for p in payload["processes"]] == ["attention", "attention", "ffn"]
    assert main(["--npu-topology", "recipe-baseline", "--devices-per-node", "16", "--model", MODEL,
                 *NODE_ARGS]) == 0
    text = capsys.readouterr().out
    assert text.count("vllm serve") == 2 and "--headless" in text


def test_cli_rejects_invalid_combination_with_exit_code_2():
    completed = subprocess.run(
        [sys.executable, "-m", "pytest_afd.backends.vllm_ascend.launch", "--npu-topology",
         "dp3pcp8-ep8", "--devices-per-node", "16", "--model", MODEL, *NODE_ARGS,
         "--ffn-arg=--enable-dbo"],
        capture_output=True, text=True, timeout=60)
    assert completed.returncode == 2
    assert "native DBO" in completed.stderr and completed.stdout == ""


def test_plan_says_how_to_attach_the_harness():
    plan = build_launch_plan("dp2tp8-ep16", recipe_options(split="token_balanced",
                                                           chunk_size=16384))
    env = plan.attach_env()
    assert env["AFD_ASCEND_SERVER_URL"] == "http://10.0.0.1:8000"
    declared = RunSettings(**json.loads(env["AFD_ASCEND_SERVER_SETTINGS"]))
    assert (declared.split_policy, declared.chunk_size, declared.max_num_batched_tokens) == (
        "token_balanced", 16384, 140000)
    assert "AFD_ASCEND_SERVER_SETTINGS=" in plan.format_text().splitlines()[1]


@pytest.mark.parametrize(("topology", "nodes", "attention_processes"),
                         [("dp3pcp8-ep8", RECIPE_NODES, 2), ("dp1pcp8-ep8", RECIPE_NODES[:1], 1)])
def test_token_balanced_with_pcp_prints_plans(capsys, topology, nodes, attention_processes):
    node_args = [arg for node in nodes for arg in ("--node-address", node)]
    assert main(["--npu-topology", topology, "--devices-per-node", "16", "--model", MODEL,
                 *node_args, "--nic-name", NIC, "--split", "token_balanced", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["split"] == "token_balanced" and payload["nodes"] == list(nodes)
    attention = [p for p in payload["processes"] if p["role"] == "attention"]
    assert len(attention) == attention_processes
    for process in attention:
        argv = process["argv"]
        assert argv[argv.index("--prefill-context-parallel-size") + 1] == "8"
        assert "afd_split" in process["env"]["VLLM_PLUGINS"].split(",")
