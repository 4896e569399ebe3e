"""Gate 1: the engine glue's per-step checks reject a broken split, each the one it should.

The CPU backend splits through the engine glue the AFD-plugin hook runs
(``pytest_afd.backends.cpu.engine_glue``): the adapter slices engine-layout
metadata and checks what it produced, then ``check_engine_step`` checks the
read-back host copies and the fields the kernels read. Each case injects one
production fault of the adapters (``pytest_afd.faults.registry``) into a real run and
asserts that the run fails in the check meant to see it:

* a tail host computed-tokens copy one too high, written into the produced
  ubatch's host field: the adapter's own check
  (on hardware the only one that reads the host copies every step), in a
  small batch (the request check's lists path) and above 32 requests (its
  bytes path);
* the head's device seq_lens left at full length (host copies right): the
  backend's ``check_engine_step`` on the kernel fields.

The agreement case shows that the fingerprint the ranks all-gather tells
apart two plans of one batch that differ only in the cut.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gate_lib import (
    CPU_BACKEND,
    SPLIT_POLICY,
    gate_settings,
    make_prompts,
    page_scale,
    run_measured,
)

from afd_split import SplitConstraints, SplitInvariantError
from afd_split.checks.request_checks import LIST_CHECK_MAX_REQUESTS
from afd_split.engine.ascend import ASCEND_LAYOUTS
from afd_split.engine.vllm import VLLM_LAYOUTS
from afd_split.hook.planning.engine_step import plan_engine_step
from afd_split.plan.agree import fingerprint_words
from pytest_afd.faults.registry import get_fault
from pytest_afd.topology.spec import parse_topology

# A topology without PCP: its splits go through the adapters (PCP plans use split_metadata).
GLUE_TOPOLOGY = "dp2tp4-ep8"
SHARED_PREFIX_TOKENS = 96
PREFIX_SEED_SUFFIX = 8
SMALL_LENGTHS = (40, 150)  # the second is a 96-token prefix hit; the cut falls inside it
MANY_LENGTHS = (3,) * 20 + (60,) + (3,) * 20
ADAPTERS_PATH = "afd_split/engine/"
# The wrong host copy is written into the produced ubatch's host field after the split
# produced it (not into ``cut_request_arrays``, the helper that derives it): a check that
# re-derives the split through that helper instead of reading the ubatches back misses it
# (``adapter_check_rederives_split``) and fails these cases.
WRONG_HOST_COPY = "adapter_tail_host_field_plus_one"
ENGINE_STEP_PATH = "afd_split/hook/planning/engine_step.py"


def _settings(settings, lengths):
    """Every request in one forward (RunSettings' default runs 8 at a time)."""
    return replace(settings, max_num_seqs=max(settings.max_num_seqs, len(lengths)))


def _prompts(lengths, seed, *, prefixed: bool):
    if not prefixed:
        return make_prompts(lengths, seed), []
    prefix = make_prompts([SHARED_PREFIX_TOKENS], seed, tag="p")[0].prompt_token_ids
    new, hit = make_prompts(lengths, seed + 1)
    seeds = [make_prompts([PREFIX_SEED_SUFFIX], seed + 2, prefix=prefix, tag="s")]
    return [new, replace(hit, prompt_token_ids=prefix + hit.prompt_token_ids)], seeds


@pytest.fixture(scope="module")
def glue_case(gate_backends, afd_options):
    """Backend and split settings of the glue topology (in-process: faults reach it)."""
    if afd_options.backend != CPU_BACKEND:
        pytest.skip("faults are injected into the CPU backend's engine glue")
    topology = parse_topology(GLUE_TOPOLOGY, afd_options.aliases)
    assert topology.cpu_emulation().pcp_size == 1
    settings = gate_settings(topology, page_scale(CPU_BACKEND), split_policy=SPLIT_POLICY,
                             prefix_caching=True)
    return gate_backends.get(GLUE_TOPOLOGY), settings, afd_options.seed


def _raised_in(raised: pytest.ExceptionInfo, path: str) -> bool:
    return any(path in str(entry.path) for entry in raised.traceback)


BATCHES = {
    "lists_path": (SMALL_LENGTHS, True),
    "bytes_path": (MANY_LENGTHS, False),
}


@pytest.mark.gate
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_gate_1_the_adapters_check_rejects_a_wrong_host_copy(glue_case, batch):
    backend, settings, seed = glue_case
    lengths, prefixed = BATCHES[batch]
    assert (len(lengths) > LIST_CHECK_MAX_REQUESTS) == (batch == "bytes_path")
    prompts, seeds = _prompts(lengths, seed, prefixed=prefixed)
    settings = _settings(settings, lengths)
    clean, splits = run_measured(backend, prompts, settings, seed_prompts=seeds)
    assert splits.num_split > 0 and not splits.violations
    widest = max(len(step["schedule"]["requests"]) for step in clean.steps if step["is_split"])
    assert (widest > LIST_CHECK_MAX_REQUESTS) == (batch == "bytes_path"), widest
    with get_fault(WRONG_HOST_COPY).applied(), \
            pytest.raises(SplitInvariantError) as raised:
        run_measured(backend, prompts, settings, seed_prompts=seeds)
    assert _raised_in(raised, ADAPTERS_PATH), (
        f"the adapter's own check let a tail host copy one too high through; it was caught "
        f"later: {raised.value}"
    )


@pytest.mark.gate
def test_gate_1_check_engine_step_rejects_what_the_kernels_read(glue_case):
    backend, settings, seed = glue_case
    prompts, seeds = _prompts(SMALL_LENGTHS, seed, prefixed=True)
    with get_fault("adapter_head_device_seq_lens_full").applied(), \
            pytest.raises(SplitInvariantError) as raised:
        run_measured(backend, prompts, settings, seed_prompts=seeds)
    assert _raised_in(raised, ENGINE_STEP_PATH), raised.value


@pytest.mark.gate
def test_gate_1_agreement_fingerprint_identifies_the_cut():
    """Two plans of one batch (same tokens, policy, constraints) cut at different tokens:
    ranks holding them must not pass the fingerprint agreement."""
    tokens = [100, 100, 100, 100]
    constraints = SplitConstraints()
    one = plan_engine_step(tokens, policy="cost_balanced", constraints=constraints,
                           num_computed_tokens=[0, 0, 0, 0])
    other = plan_engine_step(tokens, policy="cost_balanced", constraints=constraints,
                             num_computed_tokens=[0, 0, 0, 4000])
    assert one.split_token != other.split_token, "the case needs two cuts of one batch"
    assert np.array_equal(one.token_counts, other.token_counts)
    assert not np.array_equal(fingerprint_words(one), fingerprint_words(other)), (
        f"cuts at {one.split_token} and {other.split_token} share one fingerprint"
    )


# The read-back check of the adapters (``checked_results``: it reads each produced
# ubatch's host copies back from its new field values and request-level checks them),
# run on the engine-layout parents (the pinned stand-in classes of vLLM 0.19.1 and vLLM-Ascend
# v0.26.0rc, the CPU engine glue's layouts), clean and with a wrong host copy injected.
READBACK_BATCHES = {
    "lists_path": ((40, 150, 70), (0, 96, 0)),
    "bytes_path": (MANY_LENGTHS, (0,) * 20 + (32,) + (0,) * 20),
}
READBACK_BLOCK_SIZE = 16
READBACK_CHECK = "checked_results"


def _engine_parent(layout, metadata):
    """(engine-layout parent, positions) of ``metadata`` on the pinned stand-in class of
    ``layout``, filled as the model runner fills it (the gate's own build)."""
    import torch

    from afd_split.engine.standins import attn_state_enum, standin_class

    def device(array, dtype=torch.int32):
        return torch.tensor(np.asarray(array), dtype=dtype)

    qsl, seq_lens, computed = (metadata.query_start_loc, metadata.seq_lens,
                               metadata.num_computed_tokens)
    positions = device(metadata.positions, torch.int64)
    values = {
        "query_start_loc": device(qsl), "query_start_loc_cpu": device(qsl),
        "seq_lens": device(seq_lens), "num_reqs": metadata.num_reqs,
        "num_actual_tokens": metadata.num_tokens, "max_query_len": metadata.max_query_len,
        "max_seq_len": metadata.max_seq_len, "block_table_tensor": device(metadata.block_table),
        "slot_mapping": device(metadata.slot_mapping, torch.int64),
        "is_prefilling": torch.ones(metadata.num_reqs, dtype=torch.bool),
        "_seq_lens_cpu": device(seq_lens), "_num_computed_tokens_cpu": device(computed),
    }
    if layout in ASCEND_LAYOUTS:
        states = attn_state_enum(layout)
        values.update(
            seq_lens_cpu=device(seq_lens), num_computed_tokens_cpu=device(computed),
            positions=positions, positions_cpu=positions.clone(),
            actual_seq_lengths_q=qsl[1:].tolist(), num_input_tokens=metadata.num_tokens,
            attn_state=states.ChunkedPrefill if computed.any() else states.PrefillNoCache)
    return standin_class(layout)(**values), positions


def _field_by_field_split(layout, tokens, computed):
    from afd_split.checks.metadata import BatchMetadata
    from afd_split.engine.ascend import split_ascend_common_metadata
    from afd_split.engine.vllm import split_common_metadata

    metadata = BatchMetadata.from_requests(list(tokens), list(computed),
                                           block_size=READBACK_BLOCK_SIZE)
    plan = plan_engine_step(list(tokens), policy=SPLIT_POLICY, constraints=SplitConstraints(),
                            num_computed_tokens=list(computed))
    assert plan.is_split and plan.boundary_request is not None, "the case needs a cut request"
    common, positions = _engine_parent(layout, metadata)
    if layout in ASCEND_LAYOUTS:
        return plan, split_ascend_common_metadata(plan, common, positions, READBACK_BLOCK_SIZE,
                                                  chunked_prefill=True)
    return plan, split_common_metadata(plan, common, positions, READBACK_BLOCK_SIZE)


@pytest.mark.gate
@pytest.mark.parametrize("layout", (VLLM_LAYOUTS[0], ASCEND_LAYOUTS[-1]),
                         ids=lambda layout: layout.version)
@pytest.mark.parametrize("batch", sorted(READBACK_BATCHES))
def test_gate_1_the_read_back_check_rejects_a_wrong_host_copy(layout, batch):
    tokens, computed = READBACK_BATCHES[batch]
    assert (len(tokens) > LIST_CHECK_MAX_REQUESTS) == (batch == "bytes_path")
    plan, pairs = _field_by_field_split(layout, tokens, computed)
    assert len(pairs) == len(plan.ubatches)
    with get_fault(WRONG_HOST_COPY).applied(), \
            pytest.raises(SplitInvariantError) as raised:
        _field_by_field_split(layout, tokens, computed)
    assert any(entry.name == READBACK_CHECK for entry in raised.traceback), (
        f"the read-back check ({READBACK_CHECK}) let a tail host copy one too high through"
    )
