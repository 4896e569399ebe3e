"""The vLLM adapter on the real CommonAttentionMetadata of an installed vLLM (optional env).

Runs only where vLLM is importable: the optional environment of
docs/split-path.md (``pip install -r requirements-vllm.txt`` with
VLLM_VERSION=0.19.1, 0.26.0 or 0.33.0 on CPU torch), as CI's vllm-adapters job does.
"""

import dataclasses
import importlib.util
import warnings

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed: the real-class adapter tests run in the optional env "
        "(requirements-vllm.txt, CI job vllm-adapters)",
        allow_module_level=True,
    )

import torch
from adapter_batches import BLOCK, PREFIX_HIT_TOKENS, assert_ubatches, build_common, snapshot
from device_guard import DEVICE, DeviceSyncGuard

from afd_split import SplitConstraints, UnsupportedSplitError, plan_split
from afd_split.engine.layout import field_names
from afd_split.engine.vllm import (
    SUPPORTED_VLLM_VERSIONS,
    VLLM_LAYOUTS,
    common_attention_metadata_type,
    common_layout,
    split_common_metadata,
)

PLAN = plan_split(PREFIX_HIT_TOKENS, policy="token_balanced", constraints=SplitConstraints(align=8))


@pytest.fixture(scope="module")
def real():
    import vllm

    if vllm.__version__ not in SUPPORTED_VLLM_VERSIONS:
        pytest.fail(f"installed vLLM {vllm.__version__} is not one of {SUPPORTED_VLLM_VERSIONS}")
    layout = next(layout for layout in VLLM_LAYOUTS if layout.version == vllm.__version__)
    return common_attention_metadata_type(), layout


def test_installed_class_matches_its_pinned_list_exactly(real):
    cls, layout = real
    assert field_names(cls) == layout.fields
    properties = sorted(n for n, o in vars(cls).items() if isinstance(o, property))
    assert properties == sorted(layout.extra["properties"])
    assert common_layout(build_common(cls, layout)[0]) is layout


@pytest.mark.parametrize("check", ["requests", "full"])
def test_prefix_hit_batch_cut_inside_a_request(real, check):
    cls, layout = real
    common, positions, meta = build_common(cls, layout)
    before = snapshot(common)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # no deprecated property is read
        results = split_common_metadata(PLAN, common, positions, BLOCK, check=check)
    assert PLAN.boundary_request == 1
    assert_ubatches(PLAN, common, positions, meta, results, layout, padded_rows=False)
    for name, tensor in before.items():
        assert torch.equal(getattr(common, name), tensor), f"parent {name} mutated"


def test_real_class_device_path_makes_no_host_sync(real):
    cls, layout = real
    common, positions, _ = build_common(cls, layout, device=DEVICE)
    guard = DeviceSyncGuard()
    with guard:
        split_common_metadata(PLAN, common, positions, BLOCK)
    assert guard.device_ops()


def test_subclass_with_a_new_field_fails_closed(real):
    cls, layout = real
    drifted = dataclasses.make_dataclass(
        "CommonAttentionMetadata", [("new_upstream_field", object, dataclasses.field(default=None))], bases=(cls,)
    )
    common, positions, _ = build_common(drifted, layout)
    with pytest.raises(UnsupportedSplitError, match="new_upstream_field"):
        split_common_metadata(PLAN, common, positions, BLOCK)


def test_fast_prefill_logits_fields_are_rejected_by_name(real):
    cls, layout = real
    common, positions, _ = build_common(cls, layout, num_logits_indices=5)
    with pytest.raises(UnsupportedSplitError, match="num_logits_indices"):
        split_common_metadata(PLAN, common, positions, BLOCK)


def test_deprecated_properties_would_be_caught(real):
    """Fault injection for the check above: reading a deprecated property does warn."""
    cls, layout = real
    if not layout.extra["properties"]:
        pytest.skip(f"vLLM {layout.version} has no deprecated seq_lens_cpu properties")
    common, _, _ = build_common(cls, layout)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with pytest.raises(DeprecationWarning):
            common.seq_lens_cpu  # noqa: B018
