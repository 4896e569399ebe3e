"""The per-step shortcuts of the adapters give what the generic paths give, and fail closed.

``replaced`` builds a ubatch object by ``__dict__`` only for classes where that
equals ``dataclasses.replace``; the per-class caches of the layout match and the
field program must not let a drifted class through.
"""

import dataclasses

import numpy as np
import pytest
import torch
from adapter_batches import BLOCK, PREFIX_HIT_TOKENS, build_common, standin_class

from afd_split import SplitConstraints, plan_split
from afd_split.engine.common import plain_field_names, replaced
from afd_split.engine.layout import match_layout
from afd_split.engine.slicing import (
    SCALAR_MAX_REQUESTS,
    host_max,
    max_query_len,
    rebased_query_start_loc,
)
from afd_split.engine.vllm import VLLM_LAYOUTS, split_common_metadata, vllm_field_program
from afd_split.errors import UnsupportedSplitError

PLAN = plan_split(PREFIX_HIT_TOKENS, policy="token_balanced", constraints=SplitConstraints(align=8))


@dataclasses.dataclass
class Plain:
    tokens: object
    count: int = 0


@dataclasses.dataclass
class WithPostInit:
    tokens: object
    count: int = 0
    derived: int = dataclasses.field(default=0, init=False)

    def __post_init__(self):
        self.derived = self.count * 2


@dataclasses.dataclass(frozen=True)
class Frozen:
    tokens: object
    count: int = 0


def test_replaced_equals_replace_and_copies_fields_only():
    parent = Plain(torch.arange(4), 3)
    parent.__dict__["cached"] = "a cached property of the parent"
    sub = replaced(parent, {"count": 5})
    assert type(sub) is Plain and sub.count == 5 and sub.tokens is parent.tokens
    assert "cached" not in sub.__dict__, "a non-field attribute of the parent leaked"
    assert vars(sub) == vars(dataclasses.replace(parent, count=5)) | {"tokens": parent.tokens}
    assert parent.count == 3, "the parent was mutated"


def test_replaced_uses_replace_for_classes_with_post_init():
    assert plain_field_names(WithPostInit) is None
    sub = replaced(WithPostInit(torch.arange(4), 1), {"count": 4})
    assert sub.derived == 8, "__post_init__ did not run"


def test_replaced_builds_frozen_dataclasses():
    assert plain_field_names(Frozen) == ("tokens", "count")
    sub = replaced(Frozen(None, 1), {"count": 2})
    assert sub == Frozen(None, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sub.count = 3


@pytest.mark.parametrize("layout", VLLM_LAYOUTS, ids=lambda layout: layout.version)
def test_split_objects_equal_the_replace_built_ones(layout):
    common, positions, _ = build_common(standin_class(layout), layout)
    for sub, _ in split_common_metadata(PLAN, common, positions, BLOCK):
        rebuilt = dataclasses.replace(common, **{name: getattr(sub, name) for name in layout.fields})
        assert vars(rebuilt).keys() == vars(sub).keys()
        assert all(getattr(rebuilt, n) is getattr(sub, n) for n in layout.fields)


def test_cached_match_still_rejects_every_drifted_class():
    layout = VLLM_LAYOUTS[0]
    good = standin_class(layout)
    assert vllm_field_program(good).layout is layout
    drifted = dataclasses.make_dataclass(
        "CommonAttentionMetadata", [(name, object, None) for name in (*layout.fields, "new_field")]
    )
    for _ in range(2):  # a failure is not cached as a success
        with pytest.raises(UnsupportedSplitError, match="new_field"):
            vllm_field_program(drifted)
        with pytest.raises(UnsupportedSplitError, match="new_field"):
            match_layout(drifted, VLLM_LAYOUTS)


def test_rebased_query_start_loc_pins_only_the_ends():
    qsl = torch.tensor([0, 40, 140, 160, 196], dtype=torch.int32)
    head, tail = PLAN.ubatches
    expected_head = [0, 40, head.num_real_tokens]
    expected_tail = [0, 140 - tail.token_slice.start, 160 - tail.token_slice.start, 100]
    left_over, already_done = 140 - head.token_slice.stop, tail.token_slice.start - 40
    assert rebased_query_start_loc(qsl, head, 0, left_over).tolist() == expected_head
    assert rebased_query_start_loc(qsl, tail, already_done, 0).tolist() == expected_tail
    assert qsl.tolist() == [0, 40, 140, 160, 196], "the parent's tensor was changed"


def test_rebased_query_start_loc_of_an_uncut_head_is_a_view():
    qsl = torch.tensor([0, 40, 140, 160, 196], dtype=torch.int32)
    plan = plan_split([40, 100, 20, 36], policy="request_boundary")
    head, tail = plan.ubatches
    assert plan.boundary_request is None
    view = rebased_query_start_loc(qsl, head, 0, 0)
    assert view.tolist() == [0, 40, 140] and view.data_ptr() == qsl.data_ptr()
    start = tail.token_slice.start
    assert rebased_query_start_loc(qsl, tail, 0, 0).tolist() == [0, 160 - start, 196 - start]


@pytest.mark.parametrize("num_reqs", [1, SCALAR_MAX_REQUESTS, SCALAR_MAX_REQUESTS + 1, 512])
def test_small_batch_maxima_equal_numpy_on_both_paths(num_reqs):
    query_lens = np.random.default_rng(num_reqs).integers(1, 5000, num_reqs)
    qsl = np.concatenate([[0], np.cumsum(query_lens)])
    assert max_query_len(qsl) == int(query_lens.max())
    assert host_max(query_lens) == int(query_lens.max())
