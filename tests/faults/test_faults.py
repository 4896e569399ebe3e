"""The seeded-fault registry: selection by name/env, patching and restoring the split path."""

from __future__ import annotations

import numpy as np
import pytest

import afd_split
from afd_split import SplitInvariantError, plan_split
from afd_split.checks.metadata import BatchMetadata, validate_split
from pytest_afd.backends.cpu import engine_glue, executor
from pytest_afd.backends.cpu import pcp as pcp_emulation
from pytest_afd.backends.cpu.afd import attention
from pytest_afd.faults import registry as faults
from pytest_afd.faults import split as split_faults

REQUIRED = {
    "tail_computed_unadjusted", "positions_not_sliced", "slot_mapping_shifted",
    "block_table_wrong_rows", "head_seq_len_not_truncated", "merge_order_swapped",
    "rows_shifted_in_gather", "retained_reference", "parent_mutated",
}  # fmt: skip
# Metadata faults the invariant checker sees on a split with a cut inside a request.
METADATA_FAULTS = (
    "tail_computed_unadjusted", "positions_not_sliced", "slot_mapping_shifted",
    "block_table_wrong_rows", "head_seq_len_not_truncated",
)  # fmt: skip


def _split_batch():
    metadata = BatchMetadata.from_requests([40, 150, 70], [0, 16, 0], block_size=16)
    plan = plan_split([40, 150, 70], policy="token_balanced", num_computed_tokens=[0, 16, 0])
    assert plan.is_split and plan.boundary_request is not None
    return plan, metadata


def test_registry_has_every_required_class():
    assert REQUIRED <= set(faults.FAULTS)
    assert len(faults.FAULTS) >= 8


def _bindings():
    return ({m: (m.split_engine_metadata, m.gather_ubatch_rows, m.merge_outputs)
             for m in (executor, attention)}, executor.Executor.execute,
            pcp_emulation.all_rank_relayouts)


@pytest.mark.parametrize("name", sorted(set(faults.FAULTS) - set(faults.GLUE_FAULTS)))
def test_fault_patches_only_inside_the_block(name):
    before = _bindings()
    fault = faults.get_fault(name)
    with fault.applied():
        assert _bindings() != before
    assert _bindings() == before
    assert not hasattr(afd_split.checks.metadata, split_faults.RETAINED_ATTRIBUTE)


@pytest.mark.parametrize("name", faults.PCP_ROW_FAULTS)
def test_pcp_row_faults_move_relaid_rows(name):
    """Direct call: under the fault every rank's relayout moves other rows than the real one."""
    plan = plan_split([40, 150, 70], policy="token_balanced", num_computed_tokens=[0, 16, 0],
                      constraints=afd_split.SplitConstraints(pcp_size=2))
    clean = pcp_emulation.all_rank_relayouts(plan, [0, 16, 0])
    with faults.get_fault(name).applied():
        faulty = pcp_emulation.all_rank_relayouts(plan, [0, 16, 0])
    for a, b in zip(clean, faulty, strict=True):
        assert not (np.array_equal(a.stage_sources, b.stage_sources)
                    and np.array_equal(a.parent_sources, b.parent_sources))
    assert faults.fault_reaches(name, 2) and not faults.fault_reaches(name, 1)


@pytest.mark.parametrize("name", METADATA_FAULTS)
def test_metadata_fault_breaks_the_split_invariants(name):
    plan, metadata = _split_batch()
    with faults.get_fault(name).applied():
        parts = executor.split_engine_metadata(plan, metadata)
    with pytest.raises(SplitInvariantError):
        validate_split(plan, metadata, parts)


def test_parent_mutated_changes_the_parent():
    plan, metadata = _split_batch()
    computed = metadata.num_computed_tokens.copy()
    with faults.get_fault("parent_mutated").applied():
        executor.split_engine_metadata(plan, metadata)
    assert not np.array_equal(metadata.num_computed_tokens, computed)


def test_retained_reference_keeps_the_split_alive():
    plan, metadata = _split_batch()
    with faults.get_fault("retained_reference").applied():
        parts = executor.split_engine_metadata(plan, metadata)
        retained = getattr(afd_split.checks.metadata, split_faults.RETAINED_ATTRIBUTE)
        assert retained == [(plan, metadata, parts)]


def test_gather_and_merge_faults_move_rows():
    plan, _ = _split_batch()
    rows = np.arange(plan.num_tokens)
    clean = [executor.gather_ubatch_rows(plan, u, rows) for u in range(2)]
    with faults.get_fault("rows_shifted_in_gather").applied():
        shifted = [executor.gather_ubatch_rows(plan, u, rows) for u in range(2)]
    assert np.array_equal(clean[0], shifted[0]) and not np.array_equal(clean[1], shifted[1])
    with faults.get_fault("merge_order_swapped").applied():
        merged = executor.merge_outputs(plan, clean)
    assert not np.array_equal(merged, rows)
    assert np.array_equal(np.sort(merged), rows)


def test_env_selection_and_unknown_name():
    assert faults.fault_from_env({}) is None
    assert faults.fault_from_env({faults.FAULT_ENV: "merge_order_swapped"}).name == (
        "merge_order_swapped"
    )
    with pytest.raises(ValueError, match=r"\$PYTEST_AFD_FAULT.*'nope'"):
        faults.fault_from_env({faults.FAULT_ENV: "nope"})
    with faults.applied_from_env({faults.FAULT_ENV: "positions_not_sliced"}) as fault:
        assert fault.name == "positions_not_sliced"
        assert executor.split_engine_metadata is not engine_glue.split_engine_metadata
    assert executor.split_engine_metadata is engine_glue.split_engine_metadata
