"""Both adapters against structural stand-ins built from every pinned field list."""

import dataclasses

import numpy as np
import pytest
import torch
from adapter_batches import (
    BLOCK,
    PREFIX_HIT_TOKENS,
    assert_ubatches,
    attn_state_enum,
    build_common,
    snapshot,
    standin_class,
)

from afd_split import SplitConstraints, SplitInvariantError, UnsupportedSplitError, plan_split
from afd_split.engine.ascend import (
    ASCEND_FIELD_RULES,
    ASCEND_LAYOUTS,
    split_ascend_common_metadata,
)
from afd_split.engine.layout import FieldRule
from afd_split.engine.vllm import VLLM_FIELD_RULES, VLLM_LAYOUTS, split_common_metadata

PLAN = plan_split(PREFIX_HIT_TOKENS, policy="token_balanced", constraints=SplitConstraints(align=8))
PADDED_PLAN = plan_split(
    PREFIX_HIT_TOKENS,
    policy="token_balanced",
    constraints=SplitConstraints(align=8, padded_total=208),
)


def vllm_case(layout, **overrides):
    return build_common(standin_class(layout), layout, **overrides)


def ascend_case(layout, **overrides):
    states = attn_state_enum(layout)
    overrides.setdefault("attn_state", states.PrefillCacheHit)
    return build_common(standin_class(layout), layout, **overrides)


def split_ascend(plan, common, positions, **options):
    options.setdefault("chunked_prefill", False)
    return split_ascend_common_metadata(plan, common, positions, BLOCK, **options)


def test_the_prefix_hit_batch_is_cut_inside_a_request():
    assert PLAN.split_token == 96 and PLAN.boundary_request == 1


@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
@pytest.mark.parametrize("check", ["requests", "full"])
def test_vllm_standin_split_is_correct_per_ubatch(layout, check):
    common, positions, meta = vllm_case(layout)
    before = snapshot(common)
    results = split_common_metadata(PLAN, common, positions, BLOCK, check=check)
    assert_ubatches(PLAN, common, positions, meta, results, layout, padded_rows=False)
    for name, tensor in before.items():
        assert torch.equal(getattr(common, name), tensor), f"parent {name} mutated"


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=lambda layout: layout.version)
@pytest.mark.parametrize("plan", [PLAN, PADDED_PLAN], ids=["unpadded", "padded_total"])
@pytest.mark.parametrize("check", ["requests", "full"])
def test_ascend_standin_split_is_correct_per_ubatch(layout, plan, check):
    common, positions, meta = ascend_case(layout)
    before = snapshot(common)
    results = split_ascend(plan, common, positions, check=check)
    assert_ubatches(plan, common, positions, meta, results, layout, padded_rows=True)
    for name, tensor in before.items():
        assert torch.equal(getattr(common, name), tensor), f"parent {name} mutated"


@pytest.mark.parametrize("layout", VLLM_LAYOUTS + ASCEND_LAYOUTS, ids=lambda layout: layout.version)
def test_every_pinned_field_has_a_rule(layout):
    rules = ASCEND_FIELD_RULES if layout in ASCEND_LAYOUTS else VLLM_FIELD_RULES
    assert [name for name in layout.fields if name not in rules] == []


@pytest.mark.parametrize("layout", VLLM_LAYOUTS + ASCEND_LAYOUTS, ids=lambda layout: layout.version)
def test_pinned_lists_record_where_they_came_from(layout):
    assert layout.version and layout.commit and layout.source
    assert len(set(layout.fields)) == len(layout.fields)


@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
def test_unknown_new_field_fails_closed_naming_it(layout):
    base = standin_class(layout)
    drifted = dataclasses.make_dataclass(
        layout.class_name, [("shiny_new_field", object, dataclasses.field(default=None))], bases=(base,)
    )
    common, positions, _ = build_common(drifted, layout)
    with pytest.raises(UnsupportedSplitError, match="shiny_new_field"):
        split_common_metadata(PLAN, common, positions, BLOCK)


@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
def test_every_reject_field_fails_closed_by_name_when_set(layout):
    rejected = [n for n in layout.fields if VLLM_FIELD_RULES[n] is FieldRule.REJECT_WHEN_SET]
    assert rejected
    for name in rejected:
        common, positions, _ = vllm_case(layout, **{name: torch.zeros(4, dtype=torch.int32)})
        with pytest.raises(UnsupportedSplitError, match=name):
            split_common_metadata(PLAN, common, positions, BLOCK)


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=lambda layout: layout.version)
def test_every_ascend_reject_field_fails_closed_by_name_when_set(layout):
    rejected = [n for n in layout.fields if ASCEND_FIELD_RULES[n] is FieldRule.REJECT_WHEN_SET]
    for name in rejected:
        default = layout.extra["defaults"].get(name)
        value = 7 if isinstance(default, int) else torch.zeros(4, dtype=torch.int32)
        common, positions, _ = ascend_case(layout, **{name: value})
        with pytest.raises(UnsupportedSplitError, match=name):
            split_ascend(PLAN, common, positions)


@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
def test_padded_counts_are_never_taken_as_real(layout):
    # A padding request entry that claims tokens is caught: the plan's counts are the real ones.
    common, positions, _ = vllm_case(layout)
    bad = common.query_start_loc_cpu.clone()
    bad[-1] += 4
    common = dataclasses.replace(common, query_start_loc_cpu=bad)
    with pytest.raises(ValueError, match="padding request"):
        split_common_metadata(PLAN, common, positions, BLOCK)


@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
def test_a_plan_for_another_batch_is_refused(layout):
    common, positions, _ = vllm_case(layout)
    other = plan_split([40, 100, 20, 44], policy="token_balanced", constraints=SplitConstraints(align=8))
    with pytest.raises(ValueError, match="different batch"):
        split_common_metadata(other, common, positions, BLOCK)


@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
def test_inconsistent_parent_host_copy_is_caught(layout):
    # A stale computed-tokens copy violates seq_len - query_len == computed: the check catches it.
    common, positions, _ = vllm_case(layout)
    if "_num_computed_tokens_cpu" not in layout.field_set:
        pytest.skip(f"vLLM {layout.version} has no host computed-tokens copy")
    stale = common._num_computed_tokens_cpu.clone()
    stale[1] = 0
    common = dataclasses.replace(common, _num_computed_tokens_cpu=stale)
    with pytest.raises(SplitInvariantError, match="computed"):
        split_common_metadata(PLAN, common, positions, BLOCK)


def test_vllm_adapter_refuses_a_pcp_plan():
    layout = VLLM_LAYOUTS[0]
    common, positions, _ = vllm_case(layout)
    plan = plan_split(PREFIX_HIT_TOKENS, policy="token_balanced", constraints=SplitConstraints(align=8, pcp_size=2))
    with pytest.raises(UnsupportedSplitError, match="pcp_size=2"):
        split_common_metadata(plan, common, positions, BLOCK)


def test_no_host_seq_lens_fails_closed_instead_of_syncing():
    layout = VLLM_LAYOUTS[-1]  # 0.33.0: only seq_lens_cpu_upper_bound
    common, positions, _ = vllm_case(layout, seq_lens_cpu_upper_bound=None)
    with pytest.raises(UnsupportedSplitError, match="device-to-host"):
        split_common_metadata(PLAN, common, positions, BLOCK)


def test_per_request_causal_tensor_is_sliced():
    layout = VLLM_LAYOUTS[-1]
    causal = torch.tensor([True, False, True, True, True, True])
    common, positions, _ = vllm_case(layout, causal=causal)
    (head, _), (tail, _) = split_common_metadata(PLAN, common, positions, BLOCK)
    assert head.causal.tolist() == [True, False] and tail.causal.tolist() == [False, True, True]


def test_caches_are_cleared_not_shared():
    layout = VLLM_LAYOUTS[1]
    common, positions, _ = vllm_case(layout, _num_computed_tokens_cache=torch.zeros(6))
    for sub, _ in split_common_metadata(PLAN, common, positions, BLOCK):
        assert sub._num_computed_tokens_cache is None
    assert np.array_equal(common._num_computed_tokens_cache.numpy(), np.zeros(6))


def _not_advanced(plan, parent, head, tail):
    """PR #203's splitter bug: the tail's boundary piece keeps the parent's computed tokens."""
    qsl, seq_lens, computed, already_done, left_over = tail
    computed = computed.copy()
    computed[0] = parent[2][plan.boundary_request]
    return head, (qsl, seq_lens, computed, already_done, left_over)


def _head_not_cut(plan, parent, head, tail):
    """The head's boundary piece keeps the whole request's seq_len."""
    qsl, seq_lens, computed, already_done, left_over = head
    seq_lens = seq_lens.copy()
    seq_lens[-1] = parent[1][plan.boundary_request]
    return (qsl, seq_lens, computed, already_done, left_over), tail


@pytest.fixture
def recompiled():
    """The vLLM adapter compiles each class again (after a test patched its rules), and
    again after the test (so no patched split stays cached)."""
    from afd_split.engine import vllm

    vllm.vllm_compiled_split.cache_clear()
    yield
    vllm.vllm_compiled_split.cache_clear()


COMPILED_MODES = pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "interpreted"])


@COMPILED_MODES
@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
@pytest.mark.parametrize("fault", [_not_advanced, _head_not_cut], ids=lambda f: f.__name__)
def test_default_check_catches_an_injected_split_bug(
    layout, fault, compiled, monkeypatch, recompiled
):
    """Fault injection into the request split the adapter uses: the per-step check fails."""
    from afd_split.checks.requests import cut_request_arrays

    if fault is _not_advanced and "_num_computed_tokens_cpu" not in layout.field_set:
        pytest.skip(f"vLLM {layout.version} holds no computed-tokens copy to get wrong")

    def buggy_split(plan, qsl, seq_lens, computed):
        parent = (qsl, seq_lens, computed)
        return list(fault(plan, parent, *cut_request_arrays(plan, qsl, seq_lens, computed)))

    monkeypatch.setattr("afd_split.engine.common.cut_request_arrays", buggy_split)
    monkeypatch.setattr("afd_split.engine.compiled.cut_request_arrays", buggy_split)
    common, positions, _ = vllm_case(layout)
    with pytest.raises(SplitInvariantError):
        split_common_metadata(PLAN, common, positions, BLOCK, compiled=compiled)


HOST_FIELD_FAULTS = {
    "query_start_loc_cpu": "query_start_loc",
    "_seq_lens_cpu": "seq_lens",
    "seq_lens_cpu_upper_bound": "seq_lens",
    "_num_computed_tokens_cpu": "num_computed_tokens",
}
"""Host field -> the StageContext array it is built from."""


@COMPILED_MODES
@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
@pytest.mark.parametrize("field", sorted(HOST_FIELD_FAULTS))
def test_default_check_reads_the_produced_host_fields(
    layout, field, compiled, monkeypatch, recompiled
):
    """Fault injection after the request split: one produced host field is built wrong (off by
    one in its last entry). The check reads the ubatches' fields, every host copy of a field
    (0.26.0 has two of seq_lens), so it sees the bug."""
    from afd_split.engine import vllm

    if field not in layout.field_set:
        pytest.skip(f"vLLM {layout.version} has no {field}")
    source = HOST_FIELD_FAULTS[field]

    def off_by_one(context):
        array = getattr(context, source).copy()
        array[-1] += 1
        return torch.from_numpy(array)

    monkeypatch.setattr(vllm, "VLLM_RECOMPUTE", {**vllm.VLLM_RECOMPUTE, field: off_by_one})
    common, positions, _ = vllm_case(layout)
    with pytest.raises(SplitInvariantError):
        split_common_metadata(PLAN, common, positions, BLOCK, compiled=compiled)


@COMPILED_MODES
@pytest.mark.parametrize("fault", ["query_start_loc", "seq_lens"])
def test_full_check_catches_a_device_side_bug(fault, compiled, monkeypatch, recompiled):
    """Fault injection into the device arithmetic: only check="full" reads it back."""
    from afd_split.engine import vllm

    real = vllm.VLLM_RECOMPUTE[fault]

    def off_by_one(context):
        return real(context) + 1

    monkeypatch.setattr(vllm, "VLLM_RECOMPUTE", {**vllm.VLLM_RECOMPUTE, fault: off_by_one})
    common, positions, _ = vllm_case(VLLM_LAYOUTS[0])
    # The per-step check cannot see it.
    split_common_metadata(PLAN, common, positions, BLOCK, compiled=compiled)
    with pytest.raises(SplitInvariantError):
        split_common_metadata(PLAN, common, positions, BLOCK, check="full", compiled=compiled)


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=lambda layout: layout.version)
def test_a_reject_field_cleared_to_none_against_a_non_none_default_is_rejected(layout):
    """``decode_token_per_req`` defaults to 1: None is not its default, so it counts as set."""
    common, positions, _ = ascend_case(layout, decode_token_per_req=None)
    with pytest.raises(UnsupportedSplitError, match="decode_token_per_req"):
        split_ascend(PLAN, common, positions)
