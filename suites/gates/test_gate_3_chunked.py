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
    UNSPLIT_POLICY,
    final_chunk_tokens,
    gate_settings,
    make_prompts,
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
    gate_topology_obj, gate_quantization, gate_backend, gate_manifest, gate_pages, chunk_size,
    gate_case, afd_options,
):
    settings = gate_settings(
        gate_topology_obj,
        gate_pages,
        split_policy=SPLIT_POLICY,
        quantization=gate_quantization,
        chunk_size=gate_pages.tokens(chunk_size),
    )
    lengths = gate_pages.lengths(PROMPT_LENGTHS)
    run = gate_case.run(
        gate=3, case=f"chunk_size={settings.chunk_size}", name=f"gate3/chunk{chunk_size}",
        dataset="gate3/mixed", backend=gate_backend, manifest=gate_manifest,
        topology=gate_topology_obj, quantization=gate_quantization,
        prompts=make_prompts(lengths, afd_options.seed), settings=settings,
        # The reference is unchunked AND unsplit: a direct whole-batch forward.
        reference_settings=replace(settings, chunk_size=None, split_policy=UNSPLIT_POLICY),
        live_reference="same prompts unchunked (chunk_size=None), unsplit direct forward",
    )  # fmt: skip
    if run is None:  # the reference phase
        return
    chunked, unchunked = run.candidate, run.reference
    tails = final_chunk_tokens(chunked, lengths)
    small_tail_tokens = gate_pages.block_size
    small_tails = {r: n for r, n in tails.items() if n < small_tail_tokens}
    gate_case.record(
        run,
        forwards=step_derived(chunked, len(chunked.steps)),
        reference_forwards=step_derived(unchunked, len(unchunked.steps)),
        final_piece_tokens_of_chunked_requests=step_derived(chunked, tails),
        small_tails=step_derived(chunked, small_tails),
        shape_unverified=shape_unverified(chunked),
    )
    if shape_unverified(chunked):
        run.verdict.raise_if_rejected()
        return
    assert tails, f"chunk_size={settings.chunk_size}: no request spread over several forwards"
    if chunk_size in SMALL_TAIL_CHUNK_SIZES:
        assert small_tails, (
            f"chunk_size={settings.chunk_size} should leave a final piece under {small_tail_tokens} "
            f"tokens; final pieces were {tails}"
        )
    run.verdict.raise_if_rejected()
