"""Gate 1 must reject a broken split: faults injected into a copy of the split metadata.

The faults are the split bugs other engines shipped (docs/gates.md): the tail's
``num_computed_tokens`` left at the parent's value (vLLM), and token-indexed
positions taken from the parent without the ubatch's offset. Each is injected
into copies of the per-ubatch metadata that the CPU executor then runs, and the
gate's own comparison (:func:`gate_lib.judge`, the one gate 1 uses) must reject
the run. A control run with the real split passes the same comparison.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
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

from afd_split import split_metadata

SHARED_PREFIX_TOKENS = 96
PREFIX_SEED_SUFFIX = 8
# The measured batch: a new request, then one whose first 96 tokens are a
# prefix hit; the token-balanced cut falls inside the second one.
MEASURED_LENGTHS = (40, 150)
QUANTIZATION = "none"


def tail_computed_unadjusted(plan, metadata, **kwargs):
    """vLLM's bug: the tail piece keeps the parent's num_computed_tokens (seq_lens are right)."""
    parts = split_metadata(plan, metadata, **kwargs)
    if plan.boundary_request is None:
        return parts
    head, tail = parts
    computed = np.array(tail.num_computed_tokens)
    computed[0] = metadata.num_computed_tokens[plan.boundary_request]
    return [head, replace(tail, num_computed_tokens=computed)]


def positions_not_sliced(plan, metadata, **kwargs):
    """Every ubatch reads the parent's positions from token 0 (the slice offset dropped)."""
    parts = split_metadata(plan, metadata, **kwargs)
    return [replace(part, positions=metadata.positions[..., : part.num_tokens]) for part in parts]


FAULTS = {
    "tail_computed_unadjusted": tail_computed_unadjusted,
    "positions_not_sliced": positions_not_sliced,
}
# Faults that corrupt what the kernels read, so the outputs themselves move. The
# unadjusted tail count alone does not (the CPU attention reads seq_lens and
# positions); only the invariant checker sees it, which is why the gate runs it.
OUTPUT_VISIBLE = ("positions_not_sliced",)


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


def run_with(fault_case, splitter, *, validate=True):
    backend, settings, prompts, seeds, _ = fault_case
    return run_measured(
        backend, prompts, settings, seed_prompts=seeds, splitter=splitter, validate=validate
    )


@pytest.mark.gate
def test_gate_1_comparison_accepts_the_real_split(fault_case, golden):
    _, _, prompts, _, reference = fault_case
    candidate, splits = run_with(fault_case, split_metadata)
    steps = split_steps(candidate, [p.num_prompt_tokens for p in prompts])
    assert any(s.boundary_request == 1 and s.boundary_computed > 0 for s in steps), steps
    verdict = judge(golden, "fault/control", candidate, reference, "float32", splits)
    verdict.raise_if_rejected()


@pytest.mark.gate
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_gate_1_comparison_rejects_an_injected_fault(fault_case, fault, golden):
    reference = fault_case[-1]
    profile = TOLERANCE_PROFILES[QUANTIZATION]
    candidate, splits = run_with(fault_case, FAULTS[fault])
    assert splits.num_split > 0, "the fault was never exercised: no split forward ran"
    verdict = judge(golden, f"fault/{fault}", candidate, reference, profile, splits)
    with pytest.raises(GateRejected):
        verdict.raise_if_rejected()
    assert verdict.violations, f"the invariant checker missed {fault}"


@pytest.mark.gate
@pytest.mark.parametrize("fault", OUTPUT_VISIBLE)
def test_gate_1_tolerance_alone_rejects_output_visible_faults(fault_case, fault, golden):
    """With the invariant checker off, the logits comparison by itself still rejects these."""
    reference = fault_case[-1]
    candidate, splits = run_with(fault_case, FAULTS[fault], validate=False)
    verdict = judge(golden, f"fault/{fault}", candidate, reference, "float32", splits)
    assert not verdict.violations
    assert not verdict.ok_outputs, f"{fault} did not move the outputs beyond float32 tolerance"
    with pytest.raises(GateRejected, match="outputs differ beyond float32"):
        verdict.raise_if_rejected()
