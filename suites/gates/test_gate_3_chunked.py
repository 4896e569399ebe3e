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
    GATE_BLOCK_SIZE,
    SPLIT_POLICY,
    TOLERANCE_PROFILES,
    final_chunk_tokens,
    gate_settings,
    judge,
    make_prompts,
    record_gate_result,
    run_measured,
)

PROMPT_LENGTHS = (100, 30, 69)
CHUNK_SIZES = (32, 48, 64)
# Sizes that must leave a final piece shorter than one page: 100 = 3 * 32 + 4 = 2 * 48 + 4.
SMALL_TAIL_CHUNK_SIZES = (32, 48)
SMALL_TAIL_TOKENS = GATE_BLOCK_SIZE


@pytest.mark.gate
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_gate_3_chunked_matches_unchunked(
    gate_topology_obj, gate_quantization, gate_backend, chunk_size, golden, afd_results, afd_options
):
    topology = gate_topology_obj
    profile = TOLERANCE_PROFILES[gate_quantization]
    settings = gate_settings(
        topology, split_policy=SPLIT_POLICY, quantization=gate_quantization, chunk_size=chunk_size
    )
    prompts = make_prompts(PROMPT_LENGTHS, afd_options.seed)
    chunked, splits = run_measured(gate_backend, prompts, settings)
    unchunked, _ = run_measured(gate_backend, prompts, replace(settings, chunk_size=None))
    tails = final_chunk_tokens(chunked, PROMPT_LENGTHS)
    small_tails = {r: n for r, n in tails.items() if n < SMALL_TAIL_TOKENS}
    verdict = judge(golden, f"gate3/chunk{chunk_size}", chunked, unchunked, profile, splits)
    record_gate_result(
        afd_results,
        settings=settings,
        topology=topology,
        prompts=prompts,
        outputs=chunked,
        dataset="gate3/mixed",
        seed=afd_options.seed,
        gate={
            "gate": 3,
            "case": f"chunk_size={chunk_size}",
            "reference": "same prompts unchunked (chunk_size=None), same split policy",
            "forwards": len(chunked.steps),
            "reference_forwards": len(unchunked.steps),
            "final_piece_tokens_of_chunked_requests": tails,
            "small_tails": small_tails,
            "verdict": verdict.to_json(),
        },
    )
    assert tails, f"chunk_size={chunk_size}: no request was spread over several forwards"
    if chunk_size in SMALL_TAIL_CHUNK_SIZES:
        assert small_tails, (
            f"chunk_size={chunk_size} should leave a final piece under {SMALL_TAIL_TOKENS} "
            f"tokens; final pieces were {tails}"
        )
    verdict.raise_if_rejected()
