"""vLLM CommonAttentionMetadata adapter, against a stand-in with the pinned field names."""

import dataclasses
import importlib.util

import numpy as np
import pytest
import torch

from afd_split import BatchMetadata, SplitConstraints, plan_split
from afd_split.adapters.vllm import (
    PINNED_COMMON_FIELDS,
    batch_metadata_from_common,
    common_attention_metadata_type,
    common_from_batch_metadata,
    split_common_metadata,
)

BLOCK = 16
PAD_ROWS = 8


@dataclasses.dataclass
class StandInCommonAttentionMetadata:
    """Same field names as the pinned vLLM CommonAttentionMetadata (plus one it does not touch)."""

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    num_computed_tokens_cpu: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_table_tensor: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool = True


def as_common(meta: BatchMetadata) -> StandInCommonAttentionMetadata:
    """vLLM-style: int32 tensors, slot_mapping padded past the real tokens with -1."""

    def i32(array):
        return torch.from_numpy(np.array(array)).to(torch.int32)

    slots = np.concatenate([meta.slot_mapping, np.full(PAD_ROWS, -1)])
    return StandInCommonAttentionMetadata(
        query_start_loc=i32(meta.query_start_loc),
        query_start_loc_cpu=i32(meta.query_start_loc),
        seq_lens=i32(meta.seq_lens),
        seq_lens_cpu=i32(meta.seq_lens),
        num_computed_tokens_cpu=i32(meta.num_computed_tokens),
        num_reqs=meta.num_reqs,
        num_actual_tokens=meta.num_tokens,
        max_query_len=meta.max_query_len,
        max_seq_len=meta.max_seq_len,
        block_table_tensor=i32(meta.block_table),
        slot_mapping=torch.from_numpy(slots),
    )


def test_stand_in_has_exactly_the_pinned_fields():
    names = {f.name for f in dataclasses.fields(StandInCommonAttentionMetadata)}
    assert set(PINNED_COMMON_FIELDS) <= names


def test_round_trip_drops_padding_and_keeps_values():
    meta = BatchMetadata.from_requests([40, 100, 20], [0, 64, 0], block_size=BLOCK)
    common = as_common(meta)
    back = batch_metadata_from_common(common, torch.from_numpy(meta.positions.copy()), BLOCK)
    back.validate()
    for name in (
        "query_start_loc",
        "seq_lens",
        "num_computed_tokens",
        "slot_mapping",
        "block_table",
        "positions",
    ):
        assert np.array_equal(getattr(back, name), getattr(meta, name)), name
    rebuilt = common_from_batch_metadata(back, common)
    assert isinstance(rebuilt, StandInCommonAttentionMetadata)
    assert rebuilt.slot_mapping.dtype == common.slot_mapping.dtype
    assert rebuilt.query_start_loc.dtype == torch.int32
    assert rebuilt.num_actual_tokens == 160 and rebuilt.causal is True


def test_split_common_metadata_gives_valid_vllm_shaped_ubatches():
    tokens, computed = [40, 100, 20], [0, 64, 0]
    meta = BatchMetadata.from_requests(tokens, computed, block_size=BLOCK)
    common = as_common(meta)
    positions = torch.from_numpy(meta.positions.copy())
    plan = plan_split(tokens, policy="token_balanced", constraints=SplitConstraints(align=8))
    (head, head_pos), (tail, tail_pos) = split_common_metadata(plan, common, positions, BLOCK)
    assert head.num_reqs == 2 and tail.num_reqs == 2
    assert head.seq_lens_cpu.tolist() == [40, 104]
    assert tail.num_computed_tokens_cpu.tolist() == [104, 0]
    assert tail.query_start_loc_cpu.tolist() == [0, 60, 80]
    assert head.max_query_len == 40 and tail.max_seq_len == 164
    assert torch.equal(torch.cat([head_pos, tail_pos]), positions)
    assert torch.equal(torch.cat([head.slot_mapping, tail.slot_mapping]), common.slot_mapping[:160])
    # The parent common metadata is untouched.
    assert common.num_actual_tokens == 160 and common.slot_mapping.shape[0] == 168


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (never installed on the CPU test machine)",
)
def test_real_vllm_common_attention_metadata_has_the_pinned_fields():
    names = {f.name for f in dataclasses.fields(common_attention_metadata_type())}
    missing = set(PINNED_COMMON_FIELDS) - names
    assert not missing, f"vLLM CommonAttentionMetadata drifted: missing {sorted(missing)}"
