"""Each engine-glue fault is live: a direct call shows it changes what the glue does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from afd_split import SplitConstraints, SplitInvariantError, plan_split
from afd_split.checks.metadata import BatchMetadata, split_metadata, validate_split
from afd_split.checks.request_checks import LIST_CHECK_MAX_REQUESTS, validate_split_requests
from afd_split.checks.requests import RequestFields, split_request_fields
from afd_split.hook.planning.engine_step import check_engine_step, plan_engine_step, step_record
from afd_split.plan.agree import fingerprint_words
from pytest_afd.backends.cpu import backend, engine_glue
from pytest_afd.backends.cpu.engine_glue import (
    ASCEND_ENGINE_LAYOUT,
    ENGINE_LAYOUTS,
    VLLM_ENGINE_LAYOUT,
    adapter_split,
    engine_common,
    split_engine_metadata,
)
from pytest_afd.faults import registry as faults
from tests.support.inner_pytest import UNRELATED_PLUGINS

BLOCK = 16
SMALL = ([40, 150, 70], [0, 16, 0])
# Above LIST_CHECK_MAX_REQUESTS: the request check's bytes path; the cut falls inside the 60.
MANY = ([3] * 20 + [60] + [3] * 20, [0] * 20 + [32] + [0] * 20)
LAYOUTS = (VLLM_ENGINE_LAYOUT, ASCEND_ENGINE_LAYOUT)


def _batch(tokens, computed):
    metadata = BatchMetadata.from_requests(tokens, computed, block_size=BLOCK)
    plan = plan_split(tokens, policy="token_balanced", num_computed_tokens=computed)
    assert plan.is_split and plan.boundary_request is not None
    return plan, metadata


def _stages(plan, metadata, layout):
    common, positions = engine_common(metadata, layout)
    return adapter_split(plan, common, positions, BLOCK, layout), common


def test_the_glue_faults_are_registered():
    assert set(faults.GLUE_FAULTS) == {
        "adapter_token_rows_by_request", "adapter_head_device_seq_lens_full",
        "adapter_tail_host_computed_plus_one", "adapter_check_reads_plan",
        "engine_check_unchecked", "request_check_tail_plus_one", "fingerprint_without_cut",
        "step_record_padding_as_real",
        "stage_build_shares_builder_slot_buffer", "pcp_padded_slot_buffer_reused",
        "adapter_readback_unchecked", "adapter_tail_host_field_plus_one",
        "adapter_check_rederives_split",
    }  # fmt: skip
    assert len(MANY[0]) > LIST_CHECK_MAX_REQUESTS


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("batch", [SMALL, MANY], ids=["small", "many"])
def test_the_clean_engine_path_equals_split_metadata(layout, batch):
    plan, metadata = _batch(*batch)
    parts = split_engine_metadata(plan, metadata, layout_name=layout)
    for part, expected in zip(parts, split_metadata(plan, metadata), strict=True):
        for name in ("query_start_loc", "seq_lens", "num_computed_tokens", "slot_mapping",
                     "block_table", "positions"):
            assert np.array_equal(getattr(part, name), getattr(expected, name)), name


@pytest.mark.parametrize("layout", LAYOUTS)
def test_token_rows_by_request_slices_slots_by_request(layout):
    plan, metadata = _batch(*SMALL)
    with faults.get_fault("adapter_token_rows_by_request").applied():
        pairs, _ = _stages(plan, metadata, layout)
    head = pairs[0][0]
    num_head_requests = plan.ubatches[0].request_slice.stop
    assert head.slot_mapping.shape[-1] == num_head_requests != plan.ubatches[0].num_real_tokens


@pytest.mark.parametrize("layout", LAYOUTS)
def test_head_device_seq_lens_full_leaves_the_host_copy_right(layout):
    plan, metadata = _batch(*SMALL)
    cut = plan.boundary_request
    with faults.get_fault("adapter_head_device_seq_lens_full").applied():
        pairs, _ = _stages(plan, metadata, layout)
        with pytest.raises(SplitInvariantError):
            split_engine_metadata(plan, metadata, layout_name=layout)
    head = pairs[0][0]
    assert int(head.seq_lens[-1]) == int(metadata.seq_lens[cut])
    assert int(head._seq_lens_cpu[-1]) < int(metadata.seq_lens[cut])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("batch", [SMALL, MANY], ids=["small", "many"])
def test_tail_host_plus_one_is_rejected_by_the_adapters_check(layout, batch):
    plan, metadata = _batch(*batch)
    with faults.get_fault("adapter_tail_host_computed_plus_one").applied(), \
            pytest.raises(SplitInvariantError) as raised:
        _stages(plan, metadata, layout)
    assert any("afd_split/engine/" in str(entry.path) for entry in raised.traceback)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_check_reads_plan_lets_a_wrong_host_copy_through(layout):
    plan, metadata = _batch(*SMALL)
    with faults.get_fault("adapter_check_reads_plan").applied(), \
            faults.get_fault("adapter_tail_host_computed_plus_one").applied():
        pairs, _ = _stages(plan, metadata, layout)  # the adapter's check no longer sees it
        with pytest.raises(SplitInvariantError) as raised:  # the backend's read-back does
            split_engine_metadata(plan, metadata, layout_name=layout)
    assert not any("afd_split/engine/" in str(entry.path) for entry in raised.traceback)
    tail = pairs[1][0]
    expected = metadata.num_computed_tokens[plan.boundary_request] + plan.ubatches[0].num_real_tokens \
        - metadata.query_start_loc[plan.boundary_request]
    assert int(tail._num_computed_tokens_cpu[0]) == expected + 1


def _tail_plus_one(plan, parent):
    parts = split_request_fields(plan, parent)
    computed = parts[1].num_computed_tokens.copy()
    computed[0] += 1
    return [parts[0], RequestFields(parts[1].query_start_loc, parts[1].seq_lens, computed)]


def test_engine_check_unchecked_returns_bad_parts():
    plan, metadata = _batch(*SMALL)
    parent = RequestFields.of(metadata)
    bad = _tail_plus_one(plan, parent)
    with pytest.raises(SplitInvariantError):
        check_engine_step(plan, parent, bad)
    with faults.get_fault("engine_check_unchecked").applied():
        assert engine_glue.check_engine_step(plan, parent, bad) == bad
        assert len(engine_glue.check_engine_step(plan, parent)) == 2


@pytest.mark.parametrize("batch", [SMALL, MANY], ids=["lists_path", "bytes_path"])
def test_request_check_tail_plus_one_eases_only_the_bytes_path(batch):
    plan, metadata = _batch(*batch)
    parent = RequestFields.of(metadata)
    bad = _tail_plus_one(plan, parent)
    with pytest.raises(SplitInvariantError):
        validate_split_requests(plan, parent, bad)
    with faults.get_fault("request_check_tail_plus_one").applied():
        if plan.num_requests > LIST_CHECK_MAX_REQUESTS:
            validate_split_requests(plan, parent, bad)  # accepted: the fault
        else:
            with pytest.raises(SplitInvariantError):
                validate_split_requests(plan, parent, bad)


def test_plans_differing_only_in_the_cut_get_different_fingerprints():
    tokens = [100, 100, 100, 100]
    one = plan_engine_step(tokens, policy="cost_balanced", constraints=SplitConstraints(),
                           num_computed_tokens=[0, 0, 0, 0])
    other = plan_engine_step(tokens, policy="cost_balanced", constraints=one.constraints,
                             num_computed_tokens=[0, 0, 0, 4000])
    assert one.split_token != other.split_token
    assert (one.policy, one.constraints) == (other.policy, other.constraints)
    assert np.array_equal(one.token_counts, other.token_counts)
    assert not np.array_equal(fingerprint_words(one), fingerprint_words(other))
    with faults.get_fault("fingerprint_without_cut").applied():
        assert np.array_equal(fingerprint_words(one), fingerprint_words(other))


def test_step_record_padding_as_real_moves_the_counts():
    plan = plan_split([40, 150], policy="token_balanced", num_computed_tokens=[0, 96],
                      constraints=SplitConstraints(align=4))
    assert plan.ubatches[1].num_padded_tokens > 0
    ranks = backend.CPU_STEP_RANKS
    clean = step_record(plan, step=0, ranks=ranks)
    with faults.get_fault("step_record_padding_as_real").applied():
        faulty = backend.step_record(plan, step=0, ranks=ranks)
    assert clean["num_real_tokens"] == 190 and clean["num_padded_tokens"] > 0
    assert faulty["num_real_tokens"] == clean["num_rows"] and faulty["num_padded_tokens"] == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_glue_faults_are_restored(layout):
    plan, metadata = _batch(*SMALL)
    for name in faults.GLUE_FAULTS:
        with faults.get_fault(name).applied():
            pass
    validate_split(plan, metadata, split_engine_metadata(plan, metadata, layout_name=layout))
    assert ENGINE_LAYOUTS[layout].fields


@pytest.mark.parametrize("name", ["stage_build_shares_builder_slot_buffer",
                                  "pcp_padded_slot_buffer_reused"])
def test_the_builder_buffer_faults_reach_pcp_only_and_leave_the_guard_restored(name):
    from afd_split.hook.glue import builder_state

    runner_manager = type("Manager", (), {})()
    runner_manager.pcp_padded_slot_mapping_list = [torch.zeros(4, dtype=torch.int32)]
    builder = type("Builder", (), {})()
    builder.slot_mapping_buf = torch.zeros(4, dtype=torch.int32)
    clean = builder_state.stage_written_buffers([builder], runner_manager)
    with faults.get_fault(name).applied():
        faulty = builder_state.stage_written_buffers([builder], runner_manager)
    assert len(faulty) == len(clean) - 1  # one buffer left unguarded
    assert len(builder_state.stage_written_buffers([builder], runner_manager)) == len(clean)
    assert faults.fault_reaches(name, 2) and not faults.fault_reaches(name, 1)
GATES_DIR = Path(__file__).resolve().parents[2] / "suites" / "gates"
READBACK_GATE = "test_gate_1_glue_checks.py::test_gate_1_the_read_back_check_rejects_a_wrong_host_copy"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_readback_unchecked_lets_a_wrong_host_copy_through_the_field_by_field_path(layout):
    """The fault is live: with it, the field-by-field adapters hand back
    a tail host copy one too high that ``checked_results`` rejects without it."""
    from afd_split.engine.ascend import split_ascend_common_metadata
    from afd_split.engine.vllm import split_common_metadata

    plan, metadata = _batch(*SMALL)

    def split():
        common, positions = engine_common(metadata, layout)
        if layout == VLLM_ENGINE_LAYOUT:
            return split_common_metadata(plan, common, positions, BLOCK)
        return split_ascend_common_metadata(plan, common, positions, BLOCK,
                                            chunked_prefill=engine_glue.CHUNKED_PREFILL)

    with faults.get_fault("adapter_tail_host_computed_plus_one").applied():
        with pytest.raises(SplitInvariantError) as raised:
            split()
        assert any(entry.name == "checked_results" for entry in raised.traceback)
        with faults.get_fault("adapter_readback_unchecked").applied():
            tail = split()[1][0]
    boundary = plan.boundary_request
    expected = metadata.num_computed_tokens[boundary] + plan.ubatches[0].num_real_tokens \
        - metadata.query_start_loc[boundary]
    assert int(tail._num_computed_tokens_cpu[0]) == expected + 1


GATE_RUN_TIMEOUT_S = 300


def _gate_run(fork_server, fault: str | None, tmp_path: Path, *args: str
              ) -> subprocess.CompletedProcess:
    """``python -m pytest -m gate ARGS`` with ``$PYTEST_AFD_FAULT`` set to ``fault`` (or unset),
    as ``fault-check`` runs it: a fresh pytest process forked from the session's fork server
    (tests/support/fork_server.py), which imported torch once, not a new interpreter."""
    env = {key: value for key, value in os.environ.items() if key != faults.FAULT_ENV}
    if fault is not None:
        env[faults.FAULT_ENV] = fault
    return fork_server.run_module(
        "pytest", ["-m", "gate", "-q", "-p", "no:cacheprovider", *UNRELATED_PLUGINS,
                   "--afd-results-dir", str(tmp_path / (fault or "clean")), *args],
        env=env, timeout=GATE_RUN_TIMEOUT_S)


def test_readback_unchecked_fails_the_gate_that_runs_checked_results(tmp_path, fork_server):
    """Injected as ``fault-check`` injects it (``$PYTEST_AFD_FAULT`` in a ``pytest -m gate``
    run), the read-back gate case fails; the same run without the fault passes."""
    def gate(fault: str | None) -> subprocess.CompletedProcess:
        return _gate_run(fork_server, fault, tmp_path, str(GATES_DIR / READBACK_GATE))

    clean, faulty = gate(None), gate("adapter_readback_unchecked")
    assert clean.returncode == 0 and "4 passed" in clean.stdout, clean.stdout[-1500:]
    assert faulty.returncode == 1 and "4 failed" in faulty.stdout, faulty.stdout[-1500:]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_check_that_rederives_the_split_misses_a_wrong_produced_field(layout):
    """``adapter_check_rederives_split`` still raises on a fault of the helper it re-derives
    through (the old way the gate injected), but lets a wrong produced host field through."""
    plan, metadata = _batch(*SMALL)
    with faults.get_fault("adapter_check_rederives_split").applied():
        with faults.get_fault("adapter_tail_host_computed_plus_one").applied(), \
                pytest.raises(SplitInvariantError):
            _stages(plan, metadata, layout)
        with faults.get_fault("adapter_tail_host_field_plus_one").applied():
            pairs, _ = _stages(plan, metadata, layout)  # not seen
    with faults.get_fault("adapter_tail_host_field_plus_one").applied(), \
            pytest.raises(SplitInvariantError) as raised:
        _stages(plan, metadata, layout)  # the clean read-back check sees it
    assert any(entry.name == "checked_results" for entry in raised.traceback)
    boundary = plan.boundary_request
    expected = metadata.num_computed_tokens[boundary] + plan.ubatches[0].num_real_tokens \
        - metadata.query_start_loc[boundary]
    assert int(pairs[1][0]._num_computed_tokens_cpu[0]) == expected + 1


GLUE_GATES = "test_gate_1_glue_checks.py"


def test_rederiving_check_fails_the_gate_that_corrupts_the_produced_field(tmp_path, fork_server):
    """``fault-check``'s way (``$PYTEST_AFD_FAULT`` in a ``pytest -m gate`` run): the gate 1
    glue-check module passes clean and fails under ``adapter_check_rederives_split`` (its
    wrong-host-copy cases: two on the CPU backend's engine glue, four on the read-back path)."""
    def gate(fault: str | None) -> subprocess.CompletedProcess:
        return _gate_run(fork_server, fault, tmp_path, str(GATES_DIR / GLUE_GATES),
                         "-k", "wrong_host_copy")

    clean, faulty = gate(None), gate("adapter_check_rederives_split")
    assert clean.returncode == 0 and "6 passed" in clean.stdout, clean.stdout[-1500:]
    assert faulty.returncode == 1 and "6 failed" in faulty.stdout, faulty.stdout[-1500:]
