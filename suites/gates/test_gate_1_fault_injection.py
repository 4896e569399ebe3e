"""Gate 1 must reject a broken split: the seeded faults of ``pytest_afd.faults.registry`` applied.

The faults are the split bugs other engines shipped (docs/gates.md): the tail's
``num_computed_tokens`` left at the parent's value (vLLM), positions or slots
sliced at the wrong offset, the wrong block-table rows, an untruncated head,
gather/merge row-order bugs and a mutated parent. Each patches the split path
the CPU executor runs, and the gate's own comparison (:func:`gate_lib.judge`,
the one gate 1 uses) must reject the run. A control run with the real split
passes the same comparison, and the unsplit reference is unchanged by them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from gate_lib import (
    CPU_BACKEND,
    SPLIT_POLICY,
    TOLERANCE_PROFILES,
    UNSPLIT_POLICY,
    GateRejected,
    gate_settings,
    judge,
    make_prompts,
    page_scale,
    run_measured,
    split_steps,
)

from pytest_afd.faults.registry import (
    FAULTS,
    GLUE_FAULTS,
    NON_PCP_ROW_FAULTS,
    PCP_ROW_FAULTS,
    fault_reaches,
    get_fault,
)

SHARED_PREFIX_TOKENS = 96
PREFIX_SEED_SUFFIX = 8
# The measured batch: a new request, then one whose first 96 tokens are a
# prefix hit; the token-balanced cut falls inside the second one.
MEASURED_LENGTHS = (40, 150)
QUANTIZATION = "none"


# Faults the gate's own comparison must reject (the leaks are gate 5's: see its tests;
# the engine-glue faults are the glue checks' and the step-evidence checks': see
# test_gate_1_glue_checks.py).
LEAKS = ("retained_reference", "executor_keeps_metadata", "executor_keeps_logits_bytes")
JUDGED_FAULTS = tuple(sorted(set(FAULTS) - set(LEAKS) - set(GLUE_FAULTS)))
# Faults that corrupt what the kernels read, so the outputs themselves move. The
# unadjusted tail count, the untruncated head seq_len and a mutated parent do not
# (the CPU attention reads positions and the block table); only the invariant
# checker sees them, which is why the gate runs it.
OUTPUT_VISIBLE = (
    "positions_not_sliced", "slot_mapping_shifted", "block_table_wrong_rows",
    *NON_PCP_ROW_FAULTS, *PCP_ROW_FAULTS,
)  # fmt: skip
# Faults in the rows, not the metadata: only the outputs can show them. A PCP split's
# rows move through the relayout (as on the engine), any other split's through the
# plan's gather and merge: each row fault reaches one kind of topology.
ROW_FAULTS = (*NON_PCP_ROW_FAULTS, *PCP_ROW_FAULTS)


@pytest.fixture(scope="module")
def fault_case(gate_backends, afd_options):
    """Backend, settings, prompts and the unsplit reference for the prefix-hit batch."""
    if afd_options.backend != CPU_BACKEND:
        pytest.skip("faults are injected into the CPU executor's split metadata")
    topology = afd_options.topology
    backend = gate_backends.get(topology.canonical)
    settings = gate_settings(
        topology,
        page_scale(CPU_BACKEND),
        split_policy=SPLIT_POLICY,
        quantization=QUANTIZATION,
        prefix_caching=True,
    )
    prefix = make_prompts([SHARED_PREFIX_TOKENS], afd_options.seed, tag="p")[0].prompt_token_ids
    new, hit = make_prompts(MEASURED_LENGTHS, afd_options.seed + 1)
    prompts = [new, replace(hit, prompt_token_ids=prefix + hit.prompt_token_ids)]
    seeds = [make_prompts([PREFIX_SEED_SUFFIX], afd_options.seed + 2, prefix=prefix, tag="s")]
    reference, _ = run_measured(
        backend, prompts, replace(settings, split_policy=UNSPLIT_POLICY), seed_prompts=seeds
    )
    return backend, settings, prompts, seeds, reference


def run_with(fault_case, fault: str | None, *, validate=True):
    """The measured run with the named seeded fault applied (None: the real split path)."""
    backend, settings, prompts, seeds, _ = fault_case
    if fault is not None and not fault_reaches(fault, settings.pcp_size or 1):
        pytest.skip(f"{fault} is not on this topology's split path (pcp_size="
                    f"{settings.pcp_size}); the gates' other topologies judge it")
    if fault is None:
        return run_measured(backend, prompts, settings, seed_prompts=seeds, validate=validate)
    with get_fault(fault).applied():
        return run_measured(backend, prompts, settings, seed_prompts=seeds, validate=validate)


@pytest.mark.gate
def test_gate_1_comparison_accepts_the_real_split(fault_case, golden):
    _, _, prompts, _, reference = fault_case
    candidate, splits = run_with(fault_case, None)
    steps = split_steps(candidate, [p.num_prompt_tokens for p in prompts])
    assert any(s.boundary_request == 1 and s.boundary_computed > 0 for s in steps), steps
    verdict = judge(golden, "fault/control", candidate, reference, "float32", splits)
    verdict.raise_if_rejected()


@pytest.mark.gate
@pytest.mark.parametrize("fault", JUDGED_FAULTS)
def test_gate_1_comparison_rejects_an_injected_fault(fault_case, fault, golden):
    reference = fault_case[-1]
    profile = TOLERANCE_PROFILES[QUANTIZATION]
    candidate, splits = run_with(fault_case, fault)
    assert splits.num_split > 0, "the fault was never exercised: no split forward ran"
    verdict = judge(golden, f"fault/{fault}", candidate, reference, profile, splits)
    with pytest.raises(GateRejected):
        verdict.raise_if_rejected()
    if fault in ROW_FAULTS:
        assert not verdict.ok_outputs, f"{fault} did not move the outputs"
    else:
        assert verdict.violations, f"the invariant checker missed {fault}"


@pytest.mark.gate
def test_gate_1_reference_is_independent_of_the_split_path(fault_case, golden):
    """A seeded fault in split_metadata, gather and merge leaves the unsplit reference unchanged."""
    backend, settings, prompts, seeds, reference = fault_case
    unsplit = replace(settings, split_policy=UNSPLIT_POLICY)
    for fault in ("positions_not_sliced", "rows_shifted_in_gather", "merge_order_swapped"):
        with get_fault(fault).applied():
            again, splits = run_measured(backend, prompts, unsplit, seed_prompts=seeds)
        assert splits.num_checked == 0
        verdict = judge(golden, f"fault/reference/{fault}", again, reference, "float32")
        assert verdict.ok and verdict.max_abs_error == 0.0, (fault, verdict.report)


@pytest.mark.gate
@pytest.mark.parametrize("fault", OUTPUT_VISIBLE)
def test_gate_1_tolerance_alone_rejects_output_visible_faults(fault_case, fault, golden):
    """With the invariant checker off, the logits comparison by itself still rejects these."""
    reference = fault_case[-1]
    candidate, splits = run_with(fault_case, fault, validate=False)
    verdict = judge(golden, f"fault/{fault}", candidate, reference, "float32", splits)
    assert not verdict.violations
    assert not verdict.ok_outputs, f"{fault} did not move the outputs beyond float32 tolerance"
    with pytest.raises(GateRejected, match="outputs differ beyond float32"):
        verdict.raise_if_rejected()
