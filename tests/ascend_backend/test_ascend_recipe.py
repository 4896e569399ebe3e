"""Launch plans against the afd-plugin CAM async recipe, flag by flag (recipe values as data).

Every flag, environment variable and ``--additional-config`` value of the
recipe commands must appear in the plan with the recipe's value; every flag
the plan adds must be one of the named deviations (recipe.DEVIATIONS).
"""

import pytest

from pytest_afd.backends.vllm_ascend import recipe
from pytest_afd.backends.vllm_ascend.launch import LaunchOptions, build_launch_plan, flag_values

NODES = ("33.215.117.43", "33.215.117.44")
NIC = "enp189s0f0"
MODEL = "/path/to/DeepSeek-V3.2"
# Flags the plans add to the recipe commands -> the named deviation that explains them.
PLAN_ONLY_FLAGS = {
    "--enable-prompt-tokens-details": "--enable-prompt-tokens-details",
    "--seed": "--seed/--block-size on AFD",
    "--block-size": "--seed/--block-size on AFD",
    "--trust-remote-code": "--trust-remote-code on AFD",
    "--host": "--host <node address>",
    "--max-model-len": "FFN --max-model-len/--gpu-memory-utilization/--block-size/prefix/chunk flags",
    "--gpu-memory-utilization": "FFN --max-model-len/--gpu-memory-utilization/--block-size/prefix/chunk flags",
    "--no-enable-chunked-prefill": "FFN --max-model-len/--gpu-memory-utilization/--block-size/prefix/chunk flags",
    "--no-enable-prefix-caching": "FFN --max-model-len/--gpu-memory-utilization/--block-size/prefix/chunk flags",
    "--data-parallel-size-local": "--data-parallel-* on a single node",
    "--data-parallel-start-rank": "--data-parallel-* on a single node",
    "--data-parallel-address": "--data-parallel-* on a single node",
    "--data-parallel-rpc-port": "--data-parallel-* on a single node",
    "--headless": "--data-parallel-* on a single node",
    "--additional-config": None,  # checked field by field below
}

# Recipe flags a headless DP worker leaves out -> the deviation naming it.
HEADLESS_OMITS = {"--port": "--port/--host on headless processes"}


def plan_for(topology, **changes):
    options = LaunchOptions(model=MODEL, devices_per_node=16, node_addresses=NODES,
                            socket_ifname=NIC, **changes)
    return build_launch_plan(topology, options)


def flags_of(argv):
    return [word for word in argv[3:] if word.startswith("--")]


def same_value(actual, value):
    return actual == value or ("." in value and float(actual) == float(value))


def assert_recipe_flags(process, expected):
    for flag, value in expected.items():
        if process.headless and flag in HEADLESS_OMITS:
            assert flag not in process.argv and HEADLESS_OMITS[flag] in recipe.DEVIATIONS
        elif value is True:
            assert flag in process.argv, (process.role, flag)
        else:
            values = flag_values(process.argv, flag)
            assert len(values) == 1 and same_value(values[0], value), (process.role, flag, values)
    for flag in flags_of(process.argv):
        if flag in expected:
            continue
        assert flag in PLAN_ONLY_FLAGS, f"{process.role}: {flag} is neither recipe nor deviation"
        named = PLAN_ONLY_FLAGS[flag]
        assert named is None or named in recipe.DEVIATIONS, named


def test_afd_commands_match_the_recipe_flag_by_flag():
    plan = plan_for("dp3pcp8-ep8")
    attention0, attention1, ffn = plan.processes
    for process in (attention0, attention1):
        assert_recipe_flags(process, recipe.ATTENTION_FLAGS)
    assert "--port" not in attention1.argv and "--headless" in attention1.argv
    assert flag_values(attention1.argv, "--data-parallel-start-rank") == ["2"]
    assert flag_values(attention0.argv, "--data-parallel-size-local") == ["2"]
    assert flag_values(attention1.argv, "--data-parallel-size-local") == ["1"]
    assert flag_values(attention0.argv, "--data-parallel-address") == [NODES[0]]
    assert_recipe_flags(ffn, recipe.FFN_FLAGS)
    devices = {process.role + str(process.node): dict(process.env)["ASCEND_RT_VISIBLE_DEVICES"]
               for process in plan.processes}
    assert devices == {"attention0": ",".join(map(str, range(16))),
                       "attention1": ",".join(map(str, range(8))),
                       "ffn1": ",".join(map(str, range(8, 16)))}


def test_afd_environment_and_config_match_the_recipe():
    plan = plan_for("dp3pcp8-ep8")
    for process in plan.processes:
        env = dict(process.env)
        expected = {**recipe.COMMON_ENV, **recipe.AFD_ENV, **recipe.CONTEXT_PARALLEL_ENV,
                    recipe.AFD_FORCED_ROUTING_ENV: "1"}
        assert {key: env.get(key) for key in expected} == expected, process.role
        assert dict(process.env_prepend) == {recipe.LD_LIBRARY_PATH: recipe.CAM_OP_API_LIB}
        # Two nodes: each process names its own node's IP and the NIC for every transport.
        assert env[recipe.HCCL_IF_IP] == NODES[process.node]
        assert {env[name] for name in recipe.SOCKET_IFNAME_VARIABLES} == {NIC}
        config = process.additional_config()
        assert set(config) == {"afd"}  # the recipe passes only the afd object
        afd = config["afd"]
        assert {key: afd[key] for key in recipe.AFD_OBJECT} == dict(recipe.AFD_OBJECT)
        assert afd["host"] == NODES[0] and afd["role"] == process.role
        assert afd["connector_extra_config"] == dict(recipe.CONNECTOR_EXTRA_CONFIG)


def test_baseline_commands_match_the_recipe():
    plan = plan_for("dp4pcp8")
    for process in plan.processes:
        assert_recipe_flags(process, recipe.BASELINE_FLAGS)
        env = dict(process.env)
        expected = {**recipe.COMMON_ENV, **recipe.BASELINE_ENV, **recipe.CONTEXT_PARALLEL_ENV}
        assert {key: env.get(key) for key in expected} == expected
        assert process.additional_config() == dict(recipe.BASELINE_ADDITIONAL_CONFIG)
        assert process.env_prepend == ()  # the CAM library is the AFD connector's
    assert [p.headless for p in plan.processes] == [False, True]


def test_natural_routing_is_a_choice_the_plan_records():
    afd = plan_for("dp3pcp8-ep8", routing="natural")
    assert {dict(p.env)[recipe.AFD_FORCED_ROUTING_ENV] for p in afd.processes} == {"0"}
    assert afd.run_settings["routing"] == "natural"
    baseline = plan_for("dp4pcp8", routing="natural")
    assert {p.additional_config()["enable_force_load_balance"] for p in baseline.processes} == {False}
    assert plan_for("dp3pcp8-ep8").run_settings["routing"] == recipe.RECIPE_ROUTING


@pytest.mark.parametrize("stack, mode", [(recipe.STACK_V019, []), (recipe.STACK_V026, ["deepseek_v32"])])
def test_tokenizer_mode_on_the_v026_line_only(stack, mode):
    plan = plan_for("dp3pcp8-ep8", stack=stack)
    assert {tuple(p.flag_values(recipe.TOKENIZER_MODE_FLAG)) for p in plan.processes} == {tuple(mode)}


def test_token_balanced_loads_the_afd_split_plugin_where_it_may_run():
    plan = plan_for("dp2tp8-ep16", split="token_balanced")
    assert {dict(p.env)["VLLM_PLUGINS"] for p in plan.processes} == {"ascend,afd,afd_split"}
    extra = {p.additional_config()["afd"]["connector_extra_config"]["async_moe_split"]
             for p in plan.processes}
    assert extra == {"token_balanced"}
    plugin_token = plan_for("dp2tp8-ep16", split="token")
    assert {dict(p.env)["VLLM_PLUGINS"] for p in plugin_token.processes} == {"ascend,afd"}


@pytest.mark.parametrize("split", ["none", "request"])
def test_the_controls_load_afd_split_on_attention_in_evidence_only_mode(split):
    """none / request: the plugin plans itself; afd_split only records on every Attention
    rank (step lines, expert load), so every policy carries the same evidence."""
    plan = plan_for("dp3pcp8-ep8", split=split)
    plugins = {(p.role, dict(p.env)["VLLM_PLUGINS"]) for p in plan.processes}
    assert plugins == {("attention", "ascend,afd,afd_split"), ("ffn", "ascend,afd")}
    extra = [p.additional_config()["afd"]["connector_extra_config"] for p in plan.processes]
    assert {e.get("async_moe_split") for e in extra} == {None if split == "none" else split}
    assert {e["async_moe_ubatching"] for e in extra} == {split != "none"}


def test_single_node_plans_need_no_nic():
    plan = build_launch_plan("dp1pcp8-ep8", LaunchOptions(model=MODEL, devices_per_node=16,
                                                          node_addresses=("127.0.0.1",)))
    for process in plan.processes:
        assert recipe.HCCL_IF_IP not in dict(process.env)
        assert "--data-parallel-address" not in process.argv


def test_recipe_data_names_its_revision():
    assert len(recipe.RECIPE_COMMIT) == 40 and recipe.RECIPE_BRANCH == "release/v0.19.1rc1"
    assert recipe.CAM_WHEELS[recipe.RECIPE_BRANCH].split("-")[2] == "cp311"
    assert recipe.PLUGIN_INSTALL_ARGS[:3] == ("-v", "--no-build-isolation", "--no-deps")


def test_token_balanced_attention_processes_split_every_step_the_plan_can_split():
    """The harness tests the split path: its Attention servers set the hook's split
    threshold to 0 (the deployed default leaves short steps unsplit), so tiny gate
    batches are split; FFN processes and other split values do not carry it."""
    from afd_split.hook.planning.threshold import SPLIT_MIN_TOKENS_ENV

    for split, attention_value in (("token_balanced", "0"), ("request", None)):
        plan = plan_for("dp3pcp8-ep8", split=split)
        for process in plan.processes:
            expected = attention_value if process.role == "attention" else None
            assert dict(process.env).get(SPLIT_MIN_TOKENS_ENV) == expected, (split, process.role)
