"""Fail-closed validation (before any process group exists) and state restore."""

import types

import pytest

from afd_split import (
    SplitSupportConfig,
    UnsupportedSplitError,
    prepare_split_runtime,
    preserved_state,
    unsupported_reasons,
    validate_split_support,
)
from afd_split.checks.support import CPU_REFERENCE_BUILDER

SUPPORTED = SplitSupportConfig(attention_builder="AscendSFAMetadataBuilder", pcp_size=8)


def test_supported_configuration_passes():
    validate_split_support(SUPPORTED)
    assert unsupported_reasons(SUPPORTED) == []
    validate_split_support(SplitSupportConfig(attention_builder=CPU_REFERENCE_BUILDER))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"attention_builder": "FlashInferMetadataBuilder"}, "attention builder 'FlashInfer"),
        ({"attention_builder": "AscendMLAMetadataBuilder"}, "not supported for token_balanced"),
        ({"graph_mode": "full_decode_only"}, "graph mode 'full_decode_only'"),
        ({"graph_mode": "piecewise"}, "graph mode 'piecewise'"),
        ({"num_stages": 3}, "num_stages=3"),
        ({"num_speculative_tokens": 2}, "speculative metadata"),
        ({"dcp_size": 2}, "dcp_size=2"),
        ({"compute_gate_on_attention": False}, "gate must run on the attention side"),
        ({"native_dbo": True}, "native DBO"),
        ({"tp_size": 0}, "invalid topology"),
        ({"split_policy": "halves"}, "unknown split policy 'halves'"),
    ],
)
def test_unsupported_combinations_fail_closed_naming_the_reason(change, reason):
    config = SplitSupportConfig(**{**SUPPORTED.__dict__, **change})
    with pytest.raises(UnsupportedSplitError, match=reason):
        validate_split_support(config)


def test_all_reasons_are_reported_together():
    config = SplitSupportConfig(attention_builder="X", graph_mode="full", dcp_size=4)
    assert len(unsupported_reasons(config)) == 3


def test_request_boundary_control_accepts_the_mla_builder_and_none_needs_nothing():
    validate_split_support(
        SplitSupportConfig(
            attention_builder="AscendMLAMetadataBuilder", split_policy="request_boundary"
        )
    )
    validate_split_support(
        SplitSupportConfig(attention_builder="anything", split_policy="none", graph_mode="full")
    )


def test_rejection_happens_before_any_process_group_is_created(tmp_path):
    import torch.distributed as dist

    initialised_before = dist.is_initialized()
    calls = []

    def init_group():
        calls.append("init")
        dist.init_process_group(
            "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
        )

    with pytest.raises(UnsupportedSplitError, match="attention builder 'Unknown'"):
        prepare_split_runtime(SplitSupportConfig(attention_builder="Unknown"), init_group)
    assert calls == []
    assert dist.is_initialized() == initialised_before


def test_supported_config_creates_the_group_exactly_once():
    calls = []
    result = prepare_split_runtime(SUPPORTED, lambda: calls.append("group") or "group-handle")
    assert result == "group-handle" and calls == ["group"]


# --- preserved_state ---


def make_context():
    return types.SimpleNamespace(attn_metadata="full", ubatch_index=None)


def test_state_is_restored_after_success():
    ctx, pcp = make_context(), types.SimpleNamespace(pcp_rows=[1, 2])
    original_rows = pcp.pcp_rows
    with preserved_state((ctx, ("attn_metadata", "ubatch_index")), (pcp, "pcp_rows")):
        ctx.attn_metadata, ctx.ubatch_index = "ubatch-0", 0
        pcp.pcp_rows = [3]
    assert (ctx.attn_metadata, ctx.ubatch_index) == ("full", None)
    assert pcp.pcp_rows is original_rows


def test_state_is_restored_after_an_exception_and_new_attributes_are_removed():
    ctx = make_context()
    with pytest.raises(RuntimeError, match="stage 1 failed"):
        with preserved_state((ctx, ("attn_metadata", "sp_shard"))):
            ctx.attn_metadata = "ubatch-1"
            ctx.sp_shard = "tail rows"
            raise RuntimeError("stage 1 failed")
    assert ctx.attn_metadata == "full"
    assert not hasattr(ctx, "sp_shard")


def test_attribute_deleted_inside_is_restored():
    ctx = make_context()
    with preserved_state((ctx, "attn_metadata")):
        del ctx.attn_metadata
    assert ctx.attn_metadata == "full"


def test_bad_target_is_a_clear_error():
    with pytest.raises(TypeError, match="pairs"):
        with preserved_state(make_context()):
            pass
