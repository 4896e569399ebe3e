"""Gate 4: full-layer, natural-routing accuracy smoke test.

The ``full`` model (all 61 layers) with natural routing, run the way the study
runs it (token-balanced split, with and without chunked prefill), must give the
same greedy next token for every prompt of a fixed set as the same model run
unsplit and unchunked. Forced-balanced routing changes routed expert ids and so
the outputs: it is synthetic and this gate refuses it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gate_lib import (
    QUANT_NONE,
    QUANT_W8A8,
    SPLIT_POLICY,
    UNSPLIT_POLICY,
    PageScale,
    gate_settings,
    make_prompts,
    run_measured,
)

from pytest_afd.core.backend import RequestOutput, RunOutputs, RunSettings
from pytest_afd.topology.spec import Topology

FULL_MODEL = "full"
NATURAL_ROUTING = "natural"
FORCED_ROUTING = "forced_balanced"
# The fixed prompt set: mixed lengths, one long enough to be cut inside.
PROMPT_LENGTHS = (64, 120, 24, 150)
PROMPT_SET_SEED_OFFSET = 4
CHUNK_TOKENS = 96
CANDIDATES = {"token_balanced": None, f"token_balanced_chunk{CHUNK_TOKENS}": CHUNK_TOKENS}


def accuracy_settings(
    topology: Topology, pages: PageScale, *, routing: str = NATURAL_ROUTING, **overrides
) -> RunSettings:
    """Settings for an accuracy claim: natural routing only (forced-balanced is synthetic)."""
    settings = gate_settings(topology, pages, routing=routing, **overrides)
    if settings.synthetic:
        raise ValueError(
            f"routing={routing!r} is synthetic (forced-balanced routing changes routed expert ids "
            "and outputs); the accuracy gate needs natural routing"
        )
    return settings


def top2_margins(outputs: RunOutputs) -> list[float | None]:
    """Top-1 minus top-2 logit per request: how close a greedy choice was to flipping.

    Over HTTP only top-k logprobs come back; their top-1/top-2 gap is the same
    margin (log-softmax shifts every logit equally). None when neither is there.
    """
    margins: list[float | None] = []
    for request in outputs.requests:
        if request.logits is not None:
            values = np.asarray(request.logits, dtype=np.float64)
        elif request.top_logprobs and len(request.top_logprobs) >= 2:
            values = np.fromiter(request.top_logprobs.values(), dtype=np.float64)
        else:
            margins.append(None)
            continue
        margins.append(float(np.diff(np.sort(values)[-2:])[0]))
    return margins


@pytest.fixture(scope="module")
def full_backend(gate_backends, afd_options):
    return gate_backends.get(afd_options.topology.canonical, FULL_MODEL)


@pytest.fixture(scope="module")
def references(full_backend, gate_pages, afd_options):
    """Unsplit, unchunked natural-routing outputs per quantization, computed once."""
    topology = afd_options.topology
    lengths = gate_pages.lengths(PROMPT_LENGTHS)
    prompts = make_prompts(lengths, afd_options.seed + PROMPT_SET_SEED_OFFSET)
    cache = {}

    def get(quantization):
        if quantization not in cache:
            settings = accuracy_settings(
                topology, gate_pages, split_policy=UNSPLIT_POLICY, quantization=quantization
            )
            cache[quantization], _ = run_measured(full_backend, prompts, settings)
        return cache[quantization]

    return prompts, get


@pytest.mark.gate
@pytest.mark.parametrize("quantization", (QUANT_NONE, QUANT_W8A8))
@pytest.mark.parametrize("candidate", sorted(CANDIDATES))
def test_gate_4_full_natural_greedy_tokens_match_unsplit(
    full_backend, references, gate_backends, gate_pages, candidate, quantization, gate_case,
    afd_options,
):
    topology = afd_options.topology
    prompts, reference_for = references
    settings = accuracy_settings(
        topology,
        gate_pages,
        split_policy=SPLIT_POLICY,
        quantization=quantization,
        chunk_size=gate_pages.tokens(CANDIDATES[candidate]),
    )
    assert settings.routing == NATURAL_ROUTING and not settings.synthetic
    # No stored reference: the module's unsplit full-model run, computed once per quantization.
    run = gate_case.run(
        gate=4, case=candidate, name=f"gate4/{candidate}", dataset="gate4/fixed-prompt-set",
        backend=full_backend, manifest=gate_backends.manifest(topology.canonical, FULL_MODEL),
        topology=topology, quantization=quantization, prompts=prompts, settings=settings,
        reference_source=lambda: reference_for(quantization), stored=False,
        seed=afd_options.seed + PROMPT_SET_SEED_OFFSET,
        live_reference="same full model and prompts, unsplit and unchunked, natural routing",
    )  # fmt: skip
    outputs, reference, splits, verdict = run.candidate, run.reference, run.splits, run.verdict
    gate_case.record(
        run,
        lead={"model": FULL_MODEL, "routing": settings.routing},
        next_tokens=[r.next_token for r in outputs.requests],
        reference_top2_margins=top2_margins(reference),
        reference_next_tokens=[r.next_token for r in reference.requests],
        split_forwards=splits.num_split,
    )
    assert splits.num_split > 0 or not splits.active, "no forward was split"
    assert not verdict.violations, verdict.violations
    assert not verdict.token_mismatches, (
        f"greedy next tokens differ from the unsplit unchunked run: {verdict.token_mismatches} "
        f"(reference top-1/top-2 logit margins {top2_margins(reference)})"
    )


@pytest.mark.gate
def test_gate_4_refuses_forced_balanced_routing(afd_options, gate_pages):
    topology = afd_options.topology
    with pytest.raises(ValueError, match=r"forced_balanced.*synthetic"):
        accuracy_settings(topology, gate_pages, routing=FORCED_ROUTING)
    assert replace(accuracy_settings(topology, gate_pages), routing=FORCED_ROUTING).synthetic


@pytest.mark.gate
def test_gate_4_margins_come_from_top_logprobs_over_http():
    """A backend without logits (HTTP) still gives the greedy margins gate 4 records."""
    logits = np.array([0.5, 3.0, 1.25, -2.0], dtype=np.float32)
    logprobs = logits - np.log(np.exp(logits.astype(np.float64)).sum())
    top = {int(i): float(logprobs[i]) for i in np.argsort(logits)[-3:]}
    outputs = RunOutputs(
        requests=[
            RequestOutput("logits", 4, 0, 1, logits=logits),
            RequestOutput("http", 4, 0, 1, top_logprobs=top),
            RequestOutput("neither", 4, 0, 1),
        ]
    )
    margins = top2_margins(outputs)
    assert margins[0] == pytest.approx(1.75)
    assert margins[1] == pytest.approx(1.75)
    assert margins[2] is None
