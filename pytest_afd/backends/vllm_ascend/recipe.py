"""The afd-plugin DeepSeek V3.2 CAM async recipe, as data, with the revision it was read at.

Source: ``vllm-project/afd-plugin`` ``recipe/npu/CAMAsyncAFDConnector/deepseek_v3_2/README.md``
on branch ``release/v0.19.1rc1`` at :data:`RECIPE_COMMIT` (the recipe names that
branch; ``main`` 2e4378f and ``update/v0.26.0`` 044464a carry the same commands).
Multi-node NIC variables come from the same repository's CAMP2p recipe scripts
(``recipe/npu/CAMP2pAFDConnector/deepseek_v3_2/afd_attention.sh``), the
``token`` split rule from afd-plugin PR #203 (head :data:`TOKEN_SPLIT_COMMIT`; PR #180 daad034 has it too),
the install command from the README at the same commits.

The launch plans are tested flag by flag against these values
(tests/ascend_backend/test_ascend_recipe.py); where a plan deviates, the
deviation is named in :data:`DEVIATIONS` and documented in docs/ascend.md.
"""

from __future__ import annotations

from types import MappingProxyType

RECIPE_REPO = "vllm-project/afd-plugin"
RECIPE_PATH = "recipe/npu/CAMAsyncAFDConnector/deepseek_v3_2/README.md"
RECIPE_BRANCH = "release/v0.19.1rc1"
RECIPE_COMMIT = "2f4f4627d6606dc8b6b11b406d3bc5b31e363090"
TOKEN_SPLIT_COMMIT = "22d29dc7a1a9e85f7b8f153e66485b16d7331a83"  # PR #203 head

# The vLLM / vLLM-Ascend lines the plans target, and what differs between them.
STACK_V019 = "v0.19.1rc1"
STACK_V026 = "v0.26"
STACKS = (STACK_V019, STACK_V026)
# v0.26 line (afd-plugin CAMP2p scripts on main): DeepSeek V3.2's tokenizer mode.
TOKENIZER_MODE_FLAG = "--tokenizer-mode"
STACK_TOKENIZER_MODE = MappingProxyType({STACK_V026: "deepseek_v32"})
# afd-plugin ref -> the CAM operator wheel it ships (afd_plugin/connectors/npu/bin/):
# its cpXY tag is the Python the image must have.
CAM_WHEELS = MappingProxyType({
    "release/v0.19.1rc1": "umdk_cam_op_lib-208.1.0b1-cp311-cp311-linux_aarch64.whl",
    "main": "umdk_cam_op_lib-209.0.0b1-cp312-cp312-linux_aarch64.whl",
    "update/v0.26.0": "umdk_cam_op_lib-209.0.0b1-cp312-cp312-linux_aarch64.whl",
})
CAM_OPERATOR_RUN = "afd_plugin/connectors/npu/bin/CAM_ascend910_93_openEuler_aarch64.run"
# README "Install AFD": the CMake build must see the image's torch / torch-npu.
PLUGIN_INSTALL_ENV = MappingProxyType({"AFD_BUILD_ASCEND_OPS": "1",
                                       "SOC_VERSION": "ascend910_9391"})
PLUGIN_INSTALL_ARGS = ("-v", "--no-build-isolation", "--no-deps", "-e", ".")
RECIPE_IMAGE = "quay.io/ascend/vllm-ascend:v0.19.1rc1-a3-openeuler"

# The CAM async operator library the AFD commands put first on LD_LIBRARY_PATH.
CAM_OP_API_LIB = "/usr/local/Ascend/cann-8.5.1/opp/vendors/CAM/op_api/lib"
LD_LIBRARY_PATH = "LD_LIBRARY_PATH"

# Exported by every recipe command (baseline and AFD alike).
COMMON_ENV = MappingProxyType({
    "OMP_PROC_BIND": "false",
    "OMP_NUM_THREADS": "10",
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
    "ASCEND_AGGREGATE_ENABLE": "1",
    "ASCEND_TRANSPORT_PRINT": "1",
    "ACL_OP_INIT_MODE": "1",
    "ASCEND_A3_ENABLE": "1",
    "HCCL_OP_EXPANSION_MODE": "AIV",
})
AFD_ENV = MappingProxyType({"HCCL_BUFFSIZE": "4096"})
BASELINE_ENV = MappingProxyType({"HCCL_BUFFSIZE": "200", "VLLM_ASCEND_ENABLE_MLAPO": "1"})
CONTEXT_PARALLEL_ENV = MappingProxyType({"VLLM_ASCEND_ENABLE_CONTEXT_PARALLEL": "1"})
# Forced expert balancing, the recipe's default: the AFD commands export it,
# the baseline sets enable_force_load_balance in --additional-config.
AFD_FORCED_ROUTING_ENV = "AFD_FORCE_BALANCED_TOPK_IDS"
RECIPE_ROUTING = "forced_balanced"
# Multi-node (CAMP2p scripts): the node's own IP and its NIC for every transport.
HCCL_IF_IP = "HCCL_IF_IP"
SOCKET_IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "HCCL_SOCKET_IFNAME")

# Flag values of the recipe commands, per role (flags without a value: True).
ATTENTION_FLAGS = MappingProxyType({
    "--port": "8000", "--max-num-seqs": "32", "--enforce-eager": True,
    "--served-model-name": "deepseek_v3_2", "--quantization": "ascend",
    "--max-model-len": "70000", "--max-num-batched-tokens": "140000",
    "--tensor-parallel-size": "1", "--data-parallel-size": "3",
    "--data-parallel-rpc-port": "29550", "--prefill-context-parallel-size": "8",
    "--no-enable-chunked-prefill": True, "--enable-expert-parallel": True,
    "--no-enable-prefix-caching": True, "--gpu-memory-utilization": "0.8",
})
FFN_FLAGS = MappingProxyType({
    "--port": "8001", "--max-num-seqs": "2", "--enforce-eager": True,
    "--quantization": "ascend", "--max-num-batched-tokens": "140000",
    "--served-model-name": "deepseek_v3_2", "--tensor-parallel-size": "1",
    "--data-parallel-size": "8", "--enable-expert-parallel": True,
})
BASELINE_FLAGS = MappingProxyType({
    "--port": "8000", "--enforce-eager": True, "--data-parallel-size": "4",
    "--data-parallel-rpc-port": "29550", "--tensor-parallel-size": "1",
    "--prefill-context-parallel-size": "8", "--block-size": "128",
    "--quantization": "ascend", "--seed": "1024", "--served-model-name": "deepseek_v3_2",
    "--max-num-seqs": "8", "--max-model-len": "70000", "--max-num-batched-tokens": "140000",
    "--no-enable-chunked-prefill": True, "--trust-remote-code": True,
    "--gpu-memory-utilization": "0.90", "--no-enable-prefix-caching": True,
    "--enable-expert-parallel": True,
})
CONNECTOR_EXTRA_CONFIG = MappingProxyType({
    "dynamicQuant": 1, "async_moe_ubatching": True, "async_moe_num_ubatches": 2,
    "async_moe_split": "request", "attn_ranks_per_dp": 8,
})
AFD_OBJECT = MappingProxyType({
    "connector": "CAMAsyncAFDConnector", "async": True, "port": 1239,
    "num_attention_ranks": 24, "num_ffn_ranks": 8, "compute_gate_on_attention": True,
})
BASELINE_ADDITIONAL_CONFIG = MappingProxyType({"enable_force_load_balance": True})

# What the plans do that the recipe commands do not, and why (docs/ascend.md).
DEVIATIONS = MappingProxyType({
    "--enable-prompt-tokens-details": "every serving process: usage.prompt_tokens_details."
        "cached_tokens gives realized prefix hits per request (gate 2, Stage B)",
    "VLLM_SERVER_DEV_MODE=1": "Attention/baseline, only with --dev-mode (the harness's own "
        "loopback deployments): exposes POST /reset_prefix_cache, which cold-cache phases need",
    "--api-key": "every API process: the key is read from $VLLM_API_KEY (--api-key-env) when "
        "the plan runs, never written into it; omitted only for loopback plans (--no-api-key)",
    "--seed/--block-size on AFD": "the baseline's --seed 1024 and --block-size 128 made "
        "explicit on Attention and FFN, so both layouts run the same seed and KV page",
    "--trust-remote-code on AFD": "the baseline's flag on every process (one checkpoint loader)",
    "FFN --max-model-len/--gpu-memory-utilization/--block-size/prefix/chunk flags": "the FFN "
        "side gets the Attention values so a deployment has one set of limits",
    "VLLM_PLUGINS": "ascend,afd named explicitly (plus afd_split: on every process for "
        "token_balanced, on Attention in evidence-only mode for none/request) instead "
        "of every installed general plugin",
    "VLLM_USE_V1=1": "the V1 engine named explicitly (the CAMP2p scripts do the same)",
    "VLLM_ASCEND_ENABLE_FLASHCOMM1": "set on AFD processes only when Attention uses SP, and "
        "explicitly 0 on FFN (connector guide)",
    "--host <node address>": "every API process binds its node's address, not every "
        "interface (the recipe binds the default host)",
    "--data-parallel-* on a single node": "omitted when one node holds a role (vLLM's defaults)",
    "--port/--host on headless processes": "a headless DP worker serves no API; the recipe's "
        "node-1 command passes --port unused",
})
