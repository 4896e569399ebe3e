"""The vLLM-Ascend backend factory: clear unavailability here, attach mode over real HTTP."""

import dataclasses
import json

import pytest

from pytest_afd.backends import create_backend
from pytest_afd.backends.vllm_ascend.backend import (
    ENV_MODEL_PATH,
    ENV_SERVED_MODEL_NAME,
    ENV_SERVER_SETTINGS,
    ENV_SERVER_URL,
    checkpoint_facts,
    launch_options,
    missing_requirements,
    model_path,
    node_device_count,
    npu_count_from_smi,
    npu_product_from_smi,
    server_specs,
)
from pytest_afd.backends.vllm_ascend.launch import LaunchOptions, LaunchPlanError, build_launch_plan
from pytest_afd.core.backend import (
    CAP_AFD,
    CAP_LOGITS,
    BackendUnavailable,
    CapabilityMissing,
    PromptRequest,
    RunSettings,
)
from pytest_afd.serving.http_backend import cpu_server_spec
from pytest_afd.serving.lifecycle import ManagedServer
from pytest_afd.topology.spec import parse_topology

RECIPE = parse_topology("dp3pcp8-ep8")
ENV_KEYS = (ENV_SERVER_URL, ENV_SERVER_SETTINGS, ENV_MODEL_PATH, ENV_SERVED_MODEL_NAME,
            "AFD_DEVICES_PER_NODE")
NPU_SMI_LIST = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 25.0.rc1                 Version: 25.0.rc1                                             |
+------------------------------------------------------------------------------------------------+
        Total Count                    : 16

        NPU ID                         : 0
        Product Name                   : Ascend910
"""


@pytest.fixture
def clean_env(monkeypatch):
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_unavailable_without_ascend_says_why(clean_env, tmp_path):
    clean_env.setenv("PATH", str(tmp_path))  # no npu-smi, no vllm command
    with pytest.raises(BackendUnavailable) as raised:
        create_backend("vllm-ascend", topology=RECIPE, model_name="reduced", seed=0,
                       results_dir=tmp_path)
    message = str(raised.value)
    assert "`npu-smi` is not on PATH" in message and "vllm_ascend is not installed" in message
    assert ENV_MODEL_PATH in message and ENV_SERVER_URL in message


def test_missing_requirements_lists_each_gap(tmp_path, clean_env):
    clean_env.setenv("PATH", str(tmp_path))
    missing = missing_requirements({})
    assert any("torch_npu" in item for item in missing)
    assert any("vLLM command 'vllm' is not on PATH" in item for item in missing)


def test_npu_facts_model_path_and_devices_override(tmp_path):
    assert npu_count_from_smi(NPU_SMI_LIST) == 16
    assert npu_count_from_smi("no devices") is None
    assert npu_product_from_smi(NPU_SMI_LIST) == "Ascend910"
    assert node_device_count({}, NPU_SMI_LIST) == 16
    with pytest.raises(BackendUnavailable, match="no device count"):
        node_device_count({}, "npu-smi: command failed")
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 61, "quantization_config": {"quant_method": "ascend"}}))
    assert checkpoint_facts(str(tmp_path)) == {
        "tokenizer": str(tmp_path), "num_layers": 61, "quantization": {"quant_method": "ascend"}}
    assert checkpoint_facts(str(tmp_path / "missing")) == {}
    assert model_path("full", {ENV_MODEL_PATH: "/models/ds32-{model}-w8a8"}) == "/models/ds32-full-w8a8"
    assert node_device_count({"AFD_DEVICES_PER_NODE": "16"}) == 16


def test_run_settings_map_to_a_loopback_launch_plan(monkeypatch):
    settings = RunSettings(split_policy="token_balanced", chunk_size=8192, prefix_caching=True,
                           routing="forced_balanced", quantization="w8a8")
    options = launch_options(settings, model="/m", devices=16)
    assert (options.split, options.chunk_size, options.node_addresses) == (
        "token_balanced", 8192, ("127.0.0.1",))
    plan = build_launch_plan(parse_topology("dp1tp8-ep8"), options)
    specs = server_specs(plan, startup_timeout_s=5.0)
    assert [(spec.name, spec.port, spec.health_path) for spec in specs] == [
        ("0-attention-node0", 8000, "/health"), ("1-ffn-node0", 8001, "/health")]
    assert specs[0].env["AFD_FORCE_BALANCED_TOPK_IDS"] == "1"
    # The harness's loopback deployment: bound to 127.0.0.1, no key, dev routes on.
    assert specs[0].argv[specs[0].argv.index("--host") + 1] == "127.0.0.1"
    assert "--api-key" not in specs[0].argv and specs[0].env["VLLM_SERVER_DEV_MODE"] == "1"
    monkeypatch.setenv("VLLM_API_KEY", "key-from-env")
    recipe_plan = build_launch_plan(RECIPE, LaunchOptions(
        model="/m", devices_per_node=16, node_addresses=("10.0.0.1", "10.0.0.2"),
        socket_ifname="eth0"))
    recipe_specs = server_specs(recipe_plan, startup_timeout_s=5.0)
    assert [spec.health_path for spec in recipe_specs] == ["/health", None, "/health"]
    assert [spec.argv[-2:] for spec in recipe_specs if spec.health_path] == [
        ("--api-key", "key-from-env")] * 2
    monkeypatch.delenv("VLLM_API_KEY")
    with pytest.raises(LaunchPlanError, match=r"--api-key reads \$VLLM_API_KEY, which is not set"):
        server_specs(recipe_plan, startup_timeout_s=5.0)
    with pytest.raises(CapabilityMissing, match="cost_balanced"):
        launch_options(RunSettings(split_policy="cost_balanced"), model="/m", devices=16)


def test_attached_deployment_runs_and_refuses_other_settings(tmp_path, clean_env):
    """The CPU HTTP server stands in for a deployment started by the cluster job system."""
    deployed = RunSettings(block_size=16, prefix_caching=True, return_logits=False)
    spec = cpu_server_spec(deployed, name="deployment", log_dir=tmp_path, topology="dp3pcp8-ep8",
                           model_name="reduced", seed=0)
    with ManagedServer(spec, tmp_path).start() as server:
        clean_env.setenv(ENV_SERVER_URL, server.base_url)
        clean_env.setenv(ENV_SERVED_MODEL_NAME, "reduced")
        clean_env.setenv(ENV_SERVER_SETTINGS, json.dumps(dataclasses.asdict(deployed)))
        backend = create_backend("vllm-ascend", topology=RECIPE, model_name="reduced", seed=0,
                                 results_dir=tmp_path)
        try:
            assert CAP_AFD in backend.capabilities and CAP_LOGITS not in backend.capabilities
            prompts = [PromptRequest("x", tuple(range(1, 50)))]
            # Client-side fields and the CPU emulation's split_align / pcp_size do not
            # change a vllm serve command line.
            case = dataclasses.replace(deployed, return_logits=True, split_align=8, pcp_size=8)
            outputs = backend.run(prompts, case)
            assert outputs.requests[0].error is None and outputs.requests[0].next_token >= 0
            assert backend.run(prompts, case).requests[0].num_cached_tokens == 48
            description = backend.describe()
            assert description["mode"] == "attach" and description["server"]["settings"]["block_size"] == 16
            with pytest.raises(CapabilityMissing, match=r"'split_policy': \('token_balanced', 'none'\)"):
                backend.run(prompts, dataclasses.replace(deployed, split_policy="none"))
            backend.close()
            assert server.poll() is None, "attach mode must never stop the deployment"
        finally:
            backend.close()


def test_attach_needs_declared_settings(tmp_path, clean_env):
    clean_env.setenv(ENV_SERVER_URL, "http://127.0.0.1:9")
    with pytest.raises(BackendUnavailable, match=ENV_SERVER_SETTINGS):
        create_backend("vllm-ascend", topology=RECIPE, model_name="reduced", seed=0,
                       results_dir=tmp_path)
