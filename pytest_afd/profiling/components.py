"""Operator types -> the RFC's components, and AFD stages -> components.

A ``kernel_details.csv`` row's ``Type`` is the CANN operator type. Three kinds:

- distinctive types name their component wherever they run (the SFA kernel is
  attention even outside an ``attention`` range);
- generic types (matmuls, norms, casts, element-wise) take the component of the
  AFD stage range they were launched in (``afd_split.ranges``), and "other"
  outside every range;
- anything else is "unclassified" and listed by name, never dropped.

Where each distinctive type comes from (the torch_npu / custom-op call in the
pinned code; the kernel type is the CANN op the call launches, named by the
op's CamelCase form):

vLLM-Ascend v0.19.1rc1 (da421af):
- ``attention/context_parallel/sfa_cp.py``, ``attention/sfa_v1.py``:
  ``torch.ops._C_ascend.npu_sparse_flash_attention``, ``npu_lightning_indexer``
  (``_quant``: the indexer), ``mla_preprocess``, ``torch_npu.npu_rotary_mul``;
  ``attention/context_parallel/common_cp.py``: ``torch_npu.npu_attention_update``
  (PCP partial-softmax merge); ``attention/mla_v1.py``:
  ``torch_npu.npu_kv_rmsnorm_rope_cache``, ``npu_interleave_rope``,
  ``npu_transpose_batchmatmul``, ``torch.ops._C_ascend.batch_matmul_transpose``.
- ``ops/fused_moe/moe_mlp.py``: ``torch_npu.npu_grouped_matmul``,
  ``npu_dequant_swiglu_quant``, ``torch.ops._C_ascend.grouped_matmul_swiglu_quant_weight_nz_tensor_list``;
  ``ops/fused_moe/moe_comm_method.py``: ``npu_moe_init_routing_v2``,
  ``npu_moe_finalize_routing``, ``npu_moe_token_permute`` / ``_unpermute``.
- ``ops/fused_moe/token_dispatcher.py``: ``torch_npu.npu_moe_distribute_dispatch``
  / ``_combine`` (``_v2``): EP dispatch/combine (the colocated baseline's).
- ``ops/linear_op.py``: ``torch_npu.npu_mm_all_reduce_base``,
  ``npu_mm_reduce_scatter_base`` (TP/SP matmul fused with its collective).
- HCCL collectives appear as ``hcom_<op>_`` types (allReduce, allGather,
  reduceScatter, alltoall, send, receive, broadcast).

afd-plugin main 2e4378f / release/v0.19.1rc1 2f4f462:
- ``connectors/npu/async_cam.py``, ``compat/npu/ops.py``:
  ``torch.ops.umdk_cam_op_lib.async_dispatch_send`` / ``_recv``,
  ``async_combine_send`` / ``_recv`` (the CAM async connector);
  ``connectors/npu/camp2p.py``: ``torch.ops.afd_ascend.a2e`` / ``e2a``.
- ``model_executor/models/npu/deepseek_v2_attention_gate.py``:
  ``torch_npu.npu_quant_matmul`` (the gate on the Attention side: generic,
  attributed by its ``route`` range).

Types are matched case-insensitively with ``_`` removed, so the custom op's
snake_case name and its CamelCase kernel type both match.
"""

from __future__ import annotations

from collections.abc import Mapping

ATTENTION = "attention"
DENSE_MLP = "dense_mlp"
ROUTED_MOE = "routed_moe"
SHARED_MOE = "shared_moe"
CAM = "cam_dispatch_combine"
COLLECTIVES = "tp_sp_pcp_collectives"
OTHER = "other"
UNCLASSIFIED = "unclassified"
COMPONENTS = (ATTENTION, DENSE_MLP, ROUTED_MOE, SHARED_MOE, CAM, COLLECTIVES, OTHER, UNCLASSIFIED)

HCCL_TYPE_PREFIX = "hcom"

DISTINCTIVE_TYPES: Mapping[str, str] = {
    # SFA / MLA with the lightning indexer (vLLM-Ascend attention/).
    "SparseFlashAttention": ATTENTION,
    "LightningIndexer": ATTENTION,
    "LightningIndexerQuant": ATTENTION,
    "MlaPreprocess": ATTENTION,
    "KvRmsNormRopeCache": ATTENTION,
    "InterleaveRope": ATTENTION,
    "RotaryMul": ATTENTION,
    "AttentionUpdate": ATTENTION,
    "TransposeBatchMatMul": ATTENTION,
    "BatchMatmulTranspose": ATTENTION,
    "FusedInferAttentionScore": ATTENTION,
    # Routed experts (vLLM-Ascend ops/fused_moe/).
    "GroupedMatmul": ROUTED_MOE,
    "GroupedMatmulSwigluQuantWeightNzTensorList": ROUTED_MOE,
    "DequantSwigluQuant": ROUTED_MOE,
    "MoeInitRoutingV2": ROUTED_MOE,
    "MoeFinalizeRouting": ROUTED_MOE,
    "MoeTokenPermute": ROUTED_MOE,
    "MoeTokenUnpermute": ROUTED_MOE,
    "MoeGatingTopK": ROUTED_MOE,
    # Connector dispatch / combine (afd-plugin connectors/npu/) and EP dispatch/combine.
    "AsyncDispatchSend": CAM,
    "AsyncDispatchRecv": CAM,
    "AsyncCombineSend": CAM,
    "AsyncCombineRecv": CAM,
    "A2e": CAM,
    "E2a": CAM,
    "MoeDistributeDispatch": CAM,
    "MoeDistributeDispatchV2": CAM,
    "MoeDistributeCombine": CAM,
    "MoeDistributeCombineV2": CAM,
    # TP/SP matmuls fused with their collective (vLLM-Ascend ops/linear_op.py).
    "MatmulAllReduce": COLLECTIVES,
    "MatmulReduceScatter": COLLECTIVES,
}

# CPU torch.profiler traces: a stage range's own time (torch ops run synchronously in it).
RANGE_TYPE = "AfdRange"

# Compute that belongs to whichever stage launched it.
GENERIC_TYPES = frozenset({
    RANGE_TYPE,
    "MatMul", "MatMulV2", "MatMulV3", "BatchMatMul", "BatchMatMulV2", "QuantBatchMatmulV3",
    "WeightQuantBatchMatmulV2", "QuantMatmul", "RmsNorm", "AddRmsNorm", "DynamicQuant",
    "AscendQuantV2", "AscendDequant", "Cast", "Add", "Adds", "Mul", "Muls", "Sub", "RealDiv",
    "SwiGlu", "Swiglu", "Silu", "Sigmoid", "Softmax", "SoftmaxV2", "TopKV2", "Transpose",
    "TransData", "Slice", "StridedSlice", "ConcatD", "Concat", "GatherV2", "Gather", "Index",
    "IndexPut", "ScatterNdUpdate", "ZerosLike", "Fill", "TensorMove", "MemSet", "ReduceSum",
    "Reshape", "ViewCopy", "AsStrided", "Pad", "Embedding",
})

# AFD stage (range) -> component of the generic work launched inside it.
STAGE_COMPONENTS: Mapping[str, str] = {
    "attention": ATTENTION,
    "dense_mlp": DENSE_MLP,
    "route": ROUTED_MOE,
    "routed_moe": ROUTED_MOE,
    "shared_moe": SHARED_MOE,
    "dispatch": CAM,
    "combine": CAM,
    "wait": CAM,
    "recv": CAM,
    "send": CAM,
    "ffn_idle": CAM,
    "embed": OTHER,
    "final": OTHER,
}


def _normalized(name: str) -> str:
    return name.replace("_", "").lower()


_DISTINCTIVE = {_normalized(name): component for name, component in DISTINCTIVE_TYPES.items()}
_GENERIC = frozenset(_normalized(name) for name in GENERIC_TYPES)


def stage_component(stage: str | None) -> str:
    """The component of generic work in ``stage`` (None: outside every range -> other)."""
    if stage is None:
        return OTHER
    return STAGE_COMPONENTS.get(stage, UNCLASSIFIED)


def classify(op_type: str, stage: str | None) -> str:
    """The component of one kernel of ``op_type`` launched inside ``stage``'s range (or None)."""
    key = _normalized(op_type)
    if key.startswith(HCCL_TYPE_PREFIX):
        return COLLECTIVES
    if key in _DISTINCTIVE:
        return _DISTINCTIVE[key]
    if key in _GENERIC:
        return stage_component(stage)
    return UNCLASSIFIED
