"""Issue 17's device-tensor path: the split only views / index-selects device tensors.

Every device field of the parent is a ``meta`` tensor (no data), every host
field a CPU tensor; the split runs under ``DeviceSyncGuard``, which fails on
any device scalar read or device-to-host copy. The fault-injection tests show
that the guard catches each kind of sync, so a pass means something.
"""

import dataclasses
from types import MappingProxyType

import pytest
import torch
from adapter_batches import BLOCK, PREFIX_HIT_TOKENS, attn_state_enum, build_common, standin_class
from device_guard import DEVICE, DeviceSyncError, DeviceSyncGuard

from afd_split import SplitConstraints, plan_split
from afd_split.engine import slicing, vllm
from afd_split.engine.ascend import ASCEND_LAYOUTS, split_ascend_common_metadata
from afd_split.engine.vllm import VLLM_LAYOUTS, split_common_metadata

ALLOWED_DEVICE_OPS = {
    "aten.slice.Tensor",
    "aten.select.int",
    "aten.sub.Tensor",
    "aten.sub_.Tensor",
    # Device arithmetic by plan integers, like sub: rebased_query_start_loc pins the two ends
    # of the rebased query_start_loc to [0, real tokens] with one clamp_ (no scalar read).
    "aten.clamp_.default",
    "aten.clamp.default",  # the same pinning out of place, for the head (whose slice is a view)
    "aten.fill_.Scalar",
    "aten.clone.default",
    "aten.copy_.default",
    "aten.cat.default",
    "aten.new_full.default",
    "aten.index_copy_.default",
    "aten.empty_like.default",
    "aten.new_empty.default",  # a stage's own kernel output buffer (fresh_stage_buffer)
    "aten.alias.default",
    "aten.view.default",
}
"""Views, index ops and device-side arithmetic by plan integers: nothing that syncs."""

PLANS = {
    "unpadded": plan_split(PREFIX_HIT_TOKENS, policy="token_balanced", constraints=SplitConstraints(align=8)),
    "padded_total": plan_split(
        PREFIX_HIT_TOKENS, policy="token_balanced", constraints=SplitConstraints(align=8, padded_total=208)
    ),
}


def _guarded(split, *args, **kwargs):
    guard = DeviceSyncGuard()
    with guard:
        results = split(*args, **kwargs)
    return guard, results


@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
def test_vllm_split_makes_no_host_sync(layout):
    common, positions, _ = build_common(standin_class(layout), layout, device=DEVICE)
    guard, results = _guarded(split_common_metadata, PLANS["unpadded"], common, positions, BLOCK)
    assert guard.device_ops(), "the guard saw no device op: the test would prove nothing"
    assert guard.device_ops() <= ALLOWED_DEVICE_OPS, sorted(guard.device_ops() - ALLOWED_DEVICE_OPS)
    for sub, sub_positions in results:
        assert sub.slot_mapping.device.type == DEVICE and sub_positions.device.type == DEVICE
        assert sub.query_start_loc_cpu.device.type == "cpu"


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=lambda layout: layout.version)
@pytest.mark.parametrize("plan_name", sorted(PLANS))
def test_ascend_split_makes_no_host_sync(layout, plan_name):
    states = attn_state_enum(layout)
    common, positions, _ = build_common(
        standin_class(layout), layout, device=DEVICE, attn_state=states.PrefillCacheHit
    )
    guard, results = _guarded(
        split_ascend_common_metadata, PLANS[plan_name], common, positions, BLOCK, chunked_prefill=True
    )
    assert guard.device_ops() <= ALLOWED_DEVICE_OPS, sorted(guard.device_ops() - ALLOWED_DEVICE_OPS)
    _head, tail = (sub for sub, _ in results)
    assert tail.slot_mapping.shape[0] == PLANS[plan_name].ubatches[1].num_rows


def test_pcp_rows_use_index_copy_without_sync():
    plan = plan_split([40, 100], policy="token_balanced", constraints=SplitConstraints(align=8, pcp_size=2))
    tail = plan.ubatches[1]
    slots = torch.arange(140, dtype=torch.int64, device=DEVICE)
    guard = DeviceSyncGuard()
    with guard:
        rows = slicing.ubatch_token_rows(slots, tail, with_padding=True, pad_value=-1)
    assert rows.shape[0] == tail.num_rows
    assert "aten.index_copy_.default" in guard.device_ops()


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(lambda t: t[0].item(), id="item"),
        pytest.param(lambda t: int(t[-1]), id="int"),
        pytest.param(lambda t: t.tolist(), id="tolist"),
        pytest.param(lambda t: t.cpu(), id="cpu"),
        pytest.param(lambda t: t.to("cpu"), id="to_cpu"),
        pytest.param(lambda t: torch.zeros(t.shape, dtype=t.dtype).copy_(t), id="copy_to_host"),
    ],
)
def test_guard_catches_each_kind_of_host_sync(fault):
    device_tensor = torch.arange(8, dtype=torch.int32, device=DEVICE)
    with DeviceSyncGuard(), pytest.raises(DeviceSyncError):
        fault(device_tensor)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "interpreted"])
def test_guard_catches_a_sync_injected_into_the_adapter(monkeypatch, compiled):
    """Fault injection: an adapter that reads one device scalar is caught by the guard,
    on the compiled split and on the rule-by-rule one."""
    layout = VLLM_LAYOUTS[0]
    common, positions, _ = build_common(standin_class(layout), layout, device=DEVICE)
    real_cut = slicing.cut_seq_lens

    def syncing_cut(context):
        int(context.common.seq_lens[0])  # the bug: a host read of a device value
        return real_cut(context.common.seq_lens, context.ubatch, context.left_over)

    table = MappingProxyType({**vllm.VLLM_RECOMPUTE, "seq_lens": syncing_cut})
    monkeypatch.setattr(vllm, "VLLM_RECOMPUTE", table)
    vllm.vllm_compiled_split.cache_clear()  # compile the class again, with the bug
    try:
        with DeviceSyncGuard(), pytest.raises(DeviceSyncError, match="_local_scalar_dense"):
            split_common_metadata(PLANS["unpadded"], common, positions, BLOCK, compiled=compiled)
    finally:
        vllm.vllm_compiled_split.cache_clear()


def test_full_check_is_the_one_mode_that_copies_to_host():
    """check="full" reads slot_mapping etc. to the host by design; the guard sees it."""
    layout = VLLM_LAYOUTS[0]
    common, positions, _ = build_common(standin_class(layout), layout, device=DEVICE)
    with DeviceSyncGuard(), pytest.raises(DeviceSyncError):
        split_common_metadata(PLANS["unpadded"], common, positions, BLOCK, check="full")
    assert dataclasses.is_dataclass(common)
