"""The compiled split is byte-identical to the rule-by-rule one on random batches.

For every pinned layout (vLLM 0.19.1 / 0.26.0 / 0.33.0 and vLLM-Ascend
v0.19.1rc1 / v0.26.0rc stand-ins, plus the real vLLM class where it is
installed) ``BATCHES_PER_LAYOUT`` random prefill batches, each split by both
paths with random plans: every field of every produced object must have the
same type, dtype, shape, device and bytes (or equal value), and share the
parent's object exactly where the other path does; errors must match too.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import random

import numpy as np
import pytest
import torch
from adapter_batches import attn_state_enum, build_common, standin_class

from afd_split import SplitConstraints, plan_split
from afd_split.engine.ascend import (
    ASCEND_LAYOUTS,
    ascend_compiled_split,
    ascend_field_program,
    split_ascend_common_metadata,
)
from afd_split.engine.vllm import (
    VLLM_LAYOUTS,
    split_common_metadata,
    vllm_compiled_split,
    vllm_field_program,
)
from afd_split.errors import SplitInvariantError, UnsupportedSplitError

BATCHES_PER_LAYOUT = 4000
PLANS_PER_BATCH = 4
"""Each random batch is split under this many random plans (batches counted per plan)."""
MAX_REQUESTS = 24
MAX_QUERY = 160


def _layout_cases():
    cases = [pytest.param(layout, standin_class(layout), id=f"standin-{layout.name}")
             for layout in (*VLLM_LAYOUTS, *ASCEND_LAYOUTS)]
    if importlib.util.find_spec("vllm") is not None:
        from afd_split.engine.vllm import common_attention_metadata_type, common_layout

        cls = common_attention_metadata_type()
        layout = common_layout(cls.__new__(cls))
        cases.append(pytest.param(layout, cls, id=f"real-{layout.name}"))
    return cases


def _same(left, right, where: str, *, contents: bool = True) -> None:
    assert type(left) is type(right), where
    if isinstance(left, torch.Tensor):
        assert (left.dtype, left.shape, left.device) == (right.dtype, right.shape, right.device), where
        assert not contents or left.contiguous().cpu().numpy().tobytes() == right.contiguous().cpu().numpy().tobytes(), where
    elif isinstance(left, np.ndarray):
        assert (left.dtype, left.shape) == (right.dtype, right.shape), where
        assert left.tobytes() == right.tobytes(), where
    else:
        assert left == right, where


def _assert_identical(common, compiled, interpreted, fresh_buffers) -> None:
    """Every field alike; a fresh (kernel output) buffer alike in all but its unset bytes."""
    assert len(compiled) == len(interpreted)
    for index, ((sub_c, rows_c), (sub_i, rows_i)) in enumerate(zip(compiled, interpreted,
                                                                    strict=True)):
        assert type(sub_c) is type(sub_i) is type(common)
        for field in dataclasses.fields(common):
            left, right = getattr(sub_c, field.name), getattr(sub_i, field.name)
            parent = getattr(common, field.name)
            where = f"ubatch {index} field {field.name}"
            fresh = field.name in fresh_buffers
            _same(left, right, where, contents=not fresh)
            assert (left is parent) == (right is parent), f"{where}: shared with the parent"
            assert not fresh or left is None or left is not right, where
        _same(rows_c, rows_i, f"ubatch {index} positions")


def _random_case(rng: random.Random, layout, cls):
    num_reqs = rng.randint(1, MAX_REQUESTS)
    tokens = [rng.randint(1, MAX_QUERY) for _ in range(num_reqs)]
    computed = [rng.choice((0, 0, 16, 64, rng.randint(0, 300))) for _ in range(num_reqs)]
    overrides = {}
    if "attn_state" in layout.field_set:
        states = attn_state_enum(layout)
        overrides["attn_state"] = getattr(
            states, rng.choice(("PrefillNoCache", "PrefillCacheHit", "ChunkedPrefill")))
    for name in ("_num_computed_tokens_cpu", "num_computed_tokens_cpu", "is_prefilling",
                 "positions", "positions_cpu", "seq_lens_cpu", "group_len"):
        if name in layout.field_set and rng.random() < 0.2:
            overrides[name] = None
    if rng.random() < 0.2:
        overrides["causal"] = torch.tensor([rng.random() < 0.5 for _ in range(num_reqs + 2)])
    if rng.random() < 0.03:  # a feature the split rejects: both paths must fail alike
        rejected = [n for n in ("encoder_seq_lens", "dcp_local_seq_lens", "kvcomp_metadata",
                                "graph_pad_size") if n in layout.field_set]
        overrides[rng.choice(rejected)] = 7
    common, positions, _ = build_common(cls, layout, tokens, computed, **overrides)
    if "positions" not in layout.field_set and rng.random() < 0.2:
        positions = torch.stack([positions, positions + 1, positions + 2])  # M-RoPE [3, T]
    return tokens, computed, common, positions


def _random_plan(rng: random.Random, tokens, computed, padded: bool):
    align = rng.choice((1, 1, 8, 16))
    policy = rng.choice(("token_balanced", "token_balanced", "request_boundary"))
    if len(tokens) == 1:
        policy = "token_balanced"  # request_boundary has no interior boundary to cut at
    total = sum(tokens)
    padded_total = None
    if padded and rng.random() < 0.5:
        padded_total = -(-total // align) * align + align * rng.randint(1, 3)
    for constraints in (SplitConstraints(align=align, padded_total=padded_total),
                        SplitConstraints(align=align)):
        try:  # a batch too small to split runs unsplit: that plan is compiled too
            return plan_split(tokens, policy=policy, num_computed_tokens=computed,
                              constraints=constraints, allow_fallback=True)
        except ValueError:
            continue
    raise AssertionError("no plan")


def _outcome(split):
    try:
        return split(), None
    except (SplitInvariantError, UnsupportedSplitError, ValueError) as error:
        return None, (type(error), str(error))


@pytest.mark.parametrize(("layout", "cls"), _layout_cases())
def test_compiled_split_is_byte_identical_to_the_interpreted_one(layout, cls):
    rng = random.Random(f"compiled-{layout.name}")
    ascend = "num_input_tokens" in layout.field_set
    program = (ascend_field_program if ascend else vllm_field_program)(cls)
    fresh_buffers = set(program.fresh_buffer)
    checked = splits = 0
    while checked < BATCHES_PER_LAYOUT:
        tokens, computed, common, positions = _random_case(rng, layout, cls)
        for _ in range(PLANS_PER_BATCH):
            plan = _random_plan(rng, tokens, computed, padded=ascend)
            check = "full" if rng.random() < 0.05 else "requests"
            if ascend:
                chunked = rng.random() < 0.5

                def split(compiled, plan=plan, check=check, chunked=chunked, common=common,
                          positions=positions):
                    return split_ascend_common_metadata(
                        plan, common, positions, 16, chunked_prefill=chunked, check=check,
                        compiled=compiled)
            else:

                def split(compiled, plan=plan, check=check, common=common, positions=positions):
                    return split_common_metadata(plan, common, positions, 16, check=check,
                                                 compiled=compiled)

            compiled, compiled_error = _outcome(lambda split=split: split(True))
            interpreted, interpreted_error = _outcome(lambda split=split: split(False))
            assert compiled_error == interpreted_error
            if compiled is not None:
                _assert_identical(common, compiled, interpreted, fresh_buffers)
                splits += 1
            checked += 1
    assert splits > BATCHES_PER_LAYOUT * 0.9  # most cases split; the rest fail alike


@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
def test_generated_source_is_inspectable_and_follows_the_rules(layout):
    """The source names every sliced field and no rejected one (read from the rule table)."""
    split = vllm_compiled_split(standin_class(layout))
    assert split.source.startswith("def split(plan, common, positions, parent):")
    assert "f_block_table_tensor[request_slice]" in split.source
    assert "'_num_computed_tokens_cache': None" in split.source
    # A rejected field is never computed: it can only be the parent's (unset) value.
    assert "v_encoder_seq_lens" not in split.source
    assert "'encoder_seq_lens': fields['encoder_seq_lens']" in split.source


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=lambda layout: layout.version)
def test_ascend_source_is_generated_once_per_class_and_mode(layout):
    cls = standin_class(layout)
    assert ascend_compiled_split(cls, True) is ascend_compiled_split(cls, True)
    assert ascend_compiled_split(cls, True) is not ascend_compiled_split(cls, False)
    assert "ubatch_token_rows(f_slot_mapping" in ascend_compiled_split(cls, True).source


def test_a_rule_table_change_flows_into_the_generated_code():
    """The compiler reads the rule table: a field moved to another rule is compiled so."""
    from types import MappingProxyType

    from afd_split.engine.common import compile_fields
    from afd_split.engine.compiled import compiled_split
    from afd_split.engine.layout import FieldRule
    from afd_split.engine.vllm import VLLM_FIELD_RULES, VLLM_HOST_SOURCES, VLLM_RECOMPUTE

    layout = VLLM_LAYOUTS[0]
    cls = standin_class(layout)
    rules = MappingProxyType({**VLLM_FIELD_RULES, "is_prefilling": FieldRule.CLEAR})
    program = compile_fields(layout, rules, VLLM_HOST_SOURCES, cls)
    source = compiled_split(program, VLLM_RECOMPUTE, padded_rows=False, cls=cls).source
    assert "'is_prefilling': None" in source
    assert "f_is_prefilling[request_slice]" not in source


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=lambda layout: layout.version)
def test_host_copies_of_one_ubatch_array_are_one_tensor_read_once(layout):
    """Fields sharing a row index share the work: the compiled split makes one host tensor
    for every copy of a ubatch's seq_lens (the interpreted one, one per field, same bytes)."""
    cls = standin_class(layout)
    common, positions, _ = build_common(cls, layout,
                                        attn_state=attn_state_enum(layout).PrefillCacheHit)
    plan = plan_split([40, 100, 20, 36], policy="token_balanced", num_computed_tokens=[0, 64, 0, 128],
                      constraints=SplitConstraints(align=8))
    compiled = split_ascend_common_metadata(plan, common, positions, 16, chunked_prefill=False)
    interpreted = split_ascend_common_metadata(plan, common, positions, 16, chunked_prefill=False,
                                               compiled=False)
    for (sub, _), (reference, _) in zip(compiled, interpreted, strict=True):
        assert sub._seq_lens_cpu is sub.seq_lens_cpu
        assert sub._num_computed_tokens_cpu is sub.num_computed_tokens_cpu
        assert reference._seq_lens_cpu is not reference.seq_lens_cpu
        assert sub.seq_lens_cpu.tolist() == reference.seq_lens_cpu.tolist()


@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
def test_a_class_with_post_init_goes_through_its_constructor_and_stays_identical(layout):
    """A class whose __init__ does more than assign (here a __post_init__) is built with
    dataclasses.replace by both paths: same fields, and __post_init__ ran for each ubatch."""
    base = standin_class(layout)
    seen = []

    def post_init(self):
        seen.append(self.num_reqs)

    cls = dataclasses.make_dataclass(base.__name__, [], bases=(base,),
                                     namespace={"__post_init__": post_init})
    common, positions, _ = build_common(cls, layout, [40, 100, 20, 36], [0, 64, 0, 128])
    plan = plan_split([40, 100, 20, 36], policy="token_balanced",
                      num_computed_tokens=[0, 64, 0, 128], constraints=SplitConstraints(align=8))
    assert "replace(common, **" in vllm_compiled_split(cls).source
    seen.clear()
    compiled = split_common_metadata(plan, common, positions, 16)
    assert seen == [2, 3]  # the head holds requests 0-1, the tail the rest of 1, then 2-3
    interpreted = split_common_metadata(plan, common, positions, 16, compiled=False)
    _assert_identical(common, compiled, interpreted, set())


@pytest.mark.parametrize("like", [torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int64),
                                  np.zeros(2, dtype=np.int32), np.zeros(2, dtype=np.int64)],
                         ids=["tensor-same", "tensor-convert", "array-same", "array-convert"])
def test_host_copy_read_is_the_memory_of_the_made_copy(like):
    """The compiled check reads a made host copy through host_like_read's array: it must be
    the copy's own memory (a write to the copy shows in it), also after a dtype conversion."""
    from afd_split.engine.slicing import host_like, host_like_read

    array = np.array([3, 5, 9], dtype=np.int32)
    made, read = host_like_read(array, like)
    made_array = made if isinstance(made, np.ndarray) else made.numpy()
    assert type(made) is type(host_like(array, like)) and made.dtype == like.dtype
    assert np.shares_memory(made_array, read)
    made[0] = 42
    assert read.tolist() == [42, 5, 9]
