"""The FFN side's arithmetic: which rows of a ubatch each FFN rank sees, and its experts' output.

With one FFN rank every row goes whole; with expert parallelism each rank gets the rows
routed to its contiguous expert shard plus its chunk of rows for the shared experts.
"""

from __future__ import annotations

import torch

from pytest_afd.backends.cpu.afd import connector
from pytest_afd.backends.cpu.afd.evidence import ROUTED_MOE, SHARED_MOE, Timeline
from pytest_afd.backends.cpu.afd.rank import RankLayout


def shard_for_ffn(
    topk_ids: torch.Tensor, topk_weights: torch.Tensor, topology: RankLayout, ffn_index: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows, ids, weights and flags of one ubatch that FFN rank ``ffn_index`` must see.

    One FFN rank takes every row whole. With expert parallelism a rank gets the
    rows with at least one of its experts (each row once, DeepEP-style) plus its
    contiguous chunk of rows for the shared experts; ids of other ranks' experts
    are replaced by one of the row's local experts with weight 0 so the tensor
    stays rectangular and adds exactly nothing.
    """
    num_rows = topk_ids.shape[0]
    if topology.num_ffn == 1:
        flags = torch.full((num_rows,), connector.FLAG_BOTH, dtype=torch.int64)
        return torch.arange(num_rows), topk_ids, topk_weights, flags
    low, high = topology.expert_ranges()[ffn_index]
    local = (topk_ids >= low) & (topk_ids < high)
    routed = local.any(dim=1)
    chunk = torch.tensor_split(torch.arange(num_rows), topology.num_ffn)[ffn_index]
    shared = torch.zeros(num_rows, dtype=torch.bool)
    shared[chunk] = True
    rows = torch.nonzero(routed | shared).squeeze(1)
    first_local = torch.where(local, topk_ids, torch.full_like(topk_ids, low))
    first_local = first_local.gather(1, local.int().argmax(dim=1, keepdim=True))
    ids = torch.where(local, topk_ids, first_local)[rows]
    weights = torch.where(local, topk_weights, torch.zeros_like(topk_weights))[rows]
    flags = (
        routed[rows].long() * connector.FLAG_ROUTED + shared[rows].long() * connector.FLAG_SHARED
    )
    return rows, ids, weights, flags


def compute_experts(layer, payload: connector.A2EPayload, timeline: Timeline):
    """One a2e message's expert output and its count of routed rows.

    One FFN rank sees every row with both flags and sums routed and shared experts as the
    in-process layer does; an expert-parallel rank runs each flagged subset.
    """
    normed, flags = payload.normed, payload.flags
    if bool((flags == connector.FLAG_BOTH).all()):
        with timeline.span(ROUTED_MOE, payload.layer, payload.ubatch):
            routed = layer.experts(normed, payload.topk_ids, payload.topk_weights)
        with timeline.span(SHARED_MOE, payload.layer, payload.ubatch):
            # The same sum as the in-process layer, so one FFN rank is bit-exact.
            return routed + layer.shared_experts(normed), normed.shape[0]
    result = torch.zeros_like(normed)
    routed_rows = torch.nonzero(flags & connector.FLAG_ROUTED).squeeze(1)
    shared_rows = torch.nonzero(flags & connector.FLAG_SHARED).squeeze(1)
    with timeline.span(ROUTED_MOE, payload.layer, payload.ubatch):
        if routed_rows.numel():
            result[routed_rows] = layer.experts(
                normed[routed_rows],
                payload.topk_ids[routed_rows],
                payload.topk_weights[routed_rows],
            )
    with timeline.span(SHARED_MOE, payload.layer, payload.ubatch):
        if shared_rows.numel():
            result[shared_rows] += layer.shared_experts(normed[shared_rows])
    return result, int(routed_rows.numel())
