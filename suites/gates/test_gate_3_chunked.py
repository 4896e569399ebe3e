"""Gate 3: chunked and unchunked outputs match, for several chunk sizes (one leaves a small tail).

The chunked run and the unchunked reference prefill the same prompts with the
token-balanced split; last-token logits must match within tolerance. That the
run really chunked (requests spread over several forwards) and that the
small-tail size really produced a final piece shorter than a KV page is read
from the run's own step evidence.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from gate_lib import (
    SPLIT_POLICY,
    TOLERANCE_PROFILES,
    UNSPLIT_POLICY,
    final_chunk_tokens,
    gate_settings,
    judge,
    make_prompts,
    record_gate_result,
    record_reference_case,
    run_measured,
    shape_unverified,
    step_derived,
)

PROMPT_LENGTHS = (100, 30, 69)
CHUNK_SIZES = (32, 48, 64)
# Sizes that must leave a final piece shorter than one page: 100 = 3 * 32 + 4 = 2 * 48 + 4.
# (Counts are for 16-token pages; gate_lib.PageScale grows them with the backend's page.)
SMALL_TAIL_CHUNK_SIZES = (32, 48)


@pytest.mark.gate
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_gate_3_chunked_matches_unchunked(
    gate_topology_obj,
    gate_quantization,
    gate_backend,
    gate_manifest,
    gate_pages,
    chunk_size,
    golden,
    gate_references,
    afd_results,
    afd_options,
):
    topology = gate_topology_obj
    profile = TOLERANCE_PROFILES[gate_quantization]
    settings = gate_settings(
        topology,
        gate_pages,
        split_policy=SPLIT_POLICY,
        quantization=gate_quantization,
        chunk_size=gate_pages.tokens(chunk_size),
    )
    lengths = gate_pages.lengths(PROMPT_LENGTHS)
    prompts = make_prompts(lengths, afd_options.seed)
    stored = gate_references.name(f"gate3/chunk{chunk_size}", topology.canonical, gate_quantization)
    if gate_references.recording:
        record_reference_case(
            afd_results, gate_references, stored, gate_backend, prompts, settings,
            manifest=gate_manifest,
            topology=topology, gate={"gate": 3, "case": f"chunk_size={settings.chunk_size}"},
            dataset="gate3/mixed", seed=afd_options.seed,
        )  # fmt: skip
        return
    chunked, splits = run_measured(gate_backend, prompts, settings)
    if gate_references.checking:
        unchunked = gate_references.load(stored, prompts, settings)
    else:
        # The reference is unchunked AND unsplit: a direct whole-batch forward.
        unchunked, _ = run_measured(
            gate_backend, prompts, replace(settings, chunk_size=None, split_policy=UNSPLIT_POLICY)
        )
    tails = final_chunk_tokens(chunked, lengths)
    small_tail_tokens = gate_pages.block_size
    small_tails = {r: n for r, n in tails.items() if n < small_tail_tokens}
    verdict = judge(golden, f"gate3/chunk{chunk_size}", chunked, unchunked, profile, splits)
    record_gate_result(
        afd_results,
        manifest=gate_manifest,
        settings=settings,
        topology=topology,
        prompts=prompts,
        outputs=chunked,
        dataset="gate3/mixed",
        seed=afd_options.seed,
        gate={
            "gate": 3,
            "case": f"chunk_size={settings.chunk_size}",
            "reference": gate_references.describe(stored) if gate_references.checking
            else "same prompts unchunked (chunk_size=None), unsplit direct forward",
            "forwards": step_derived(chunked, len(chunked.steps)),
            "reference_forwards": step_derived(unchunked, len(unchunked.steps)),
            "final_piece_tokens_of_chunked_requests": step_derived(chunked, tails),
            "small_tails": step_derived(chunked, small_tails),
            "shape_unverified": shape_unverified(chunked),
            "verdict": verdict.to_json(),
        },
    )
    if shape_unverified(chunked):
        verdict.raise_if_rejected()
        return
    assert tails, f"chunk_size={settings.chunk_size}: no request spread over several forwards"
    if chunk_size in SMALL_TAIL_CHUNK_SIZES:
        assert small_tails, (
            f"chunk_size={settings.chunk_size} should leave a final piece under {small_tail_tokens} "
            f"tokens; final pieces were {tails}"
        )
    verdict.raise_if_rejected()
