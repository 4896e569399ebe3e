"""Gate 1: token-balanced and unsplit outputs match within tolerance on every supported topology.

Each case runs the same prompts twice through the backend, once with the
token-balanced split and once unsplit (``split_policy="none"``), with the same
schedule and the same cached prefix, and compares last-token logits under the
model's tolerance profile. The split shape the case is about (a cut inside
one long request, on a request boundary, inside a prefix-hit request, inside a
partial chunk) is asserted from the run's own step evidence, not assumed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from gate_lib import (
    SPLIT_POLICY,
    TOLERANCE_PROFILES,
    UNSPLIT_POLICY,
    SplitStep,
    gate_settings,
    judge,
    make_prompts,
    record_gate_result,
    run_measured,
    split_steps,
)

from pytest_afd.backends.base import PromptRequest, RunOutputs

SHARED_PREFIX_TOKENS = 96  # six 16-token pages: a whole-block prefix hit
PREFIX_SEED_SUFFIX = 8
CHUNK_TOKENS = 64


def cut_inside_a_request(steps: list[SplitStep], outputs: RunOutputs) -> str | None:
    if any(s.boundary_request is not None for s in steps):
        return None
    return "no forward was cut inside a request"


def cut_on_request_boundaries(steps: list[SplitStep], outputs: RunOutputs) -> str | None:
    if steps and all(s.boundary_request is None for s in steps):
        return None
    return f"expected every split on a request boundary, got {steps}"


def cut_inside_a_prefix_hit(steps: list[SplitStep], outputs: RunOutputs) -> str | None:
    hits = {i: r.num_cached_tokens for i, r in enumerate(outputs.requests)}
    for step in steps:
        request = step.boundary_request
        if request is not None and step.boundary_computed > 0 and hits[request] > 0:
            return None
    return f"no cut inside a request with realized cached tokens (hits {hits}, splits {steps})"


def cut_inside_a_partial_chunk(steps: list[SplitStep], outputs: RunOutputs) -> str | None:
    if any(s.boundary_request is not None and not s.boundary_is_final for s in steps):
        return None
    return f"no cut inside a chunk that is only part of its prompt (splits {steps})"


@dataclass(frozen=True)
class SplitWorkload:
    name: str
    lengths: tuple[int, ...]
    expect: Callable[[list[SplitStep], RunOutputs], str | None]
    shared_prefix: int = 0  # requests listed in prefixed get this many shared tokens, seeded first
    prefixed: tuple[int, ...] = ()
    chunk_size: int | None = None

    def prompts(self, seed: int) -> tuple[list[PromptRequest], list[list[PromptRequest]]]:
        """(measured prompts, seed runs that put the shared prefix in the cache)."""
        prefix = [p.prompt_token_ids for p in make_prompts([self.shared_prefix], seed, tag="p")]
        own = make_prompts(self.lengths, seed + 1)
        prompts = [
            replace(p, prompt_token_ids=prefix[0] + p.prompt_token_ids) if i in self.prefixed else p
            for i, p in enumerate(own)
        ]
        if not self.shared_prefix:
            return prompts, []
        seed_prompt = make_prompts([PREFIX_SEED_SUFFIX], seed + 2, prefix=prefix[0], tag="seed")
        return prompts, [seed_prompt]


WORKLOADS = (
    SplitWorkload("one_long_request", (300,), cut_inside_a_request),
    SplitWorkload("equal_requests", (96, 96, 96), cut_inside_a_request),
    SplitWorkload("unequal_requests", (150, 37, 260), cut_inside_a_request),
    SplitWorkload("cut_on_request_boundary", (128, 64, 64), cut_on_request_boundaries),
    SplitWorkload(
        "prefix_hit_nonzero_computed",
        (40, 150),
        cut_inside_a_prefix_hit,
        shared_prefix=SHARED_PREFIX_TOKENS,
        prefixed=(1,),
    ),
    SplitWorkload(
        "chunked_partial_query", (150, 40), cut_inside_a_partial_chunk, chunk_size=CHUNK_TOKENS
    ),
)


@pytest.mark.gate
@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_gate_1_token_balanced_matches_unsplit(
    gate_topology_obj, gate_quantization, gate_backend, workload, golden, afd_results, afd_options
):
    topology = gate_topology_obj
    quantization = gate_quantization
    profile = TOLERANCE_PROFILES[quantization]
    settings = gate_settings(
        topology,
        split_policy=SPLIT_POLICY,
        quantization=quantization,
        chunk_size=workload.chunk_size,
        prefix_caching=bool(workload.shared_prefix),
    )
    prompts, seeds = workload.prompts(afd_options.seed)
    candidate, splits = run_measured(gate_backend, prompts, settings, seed_prompts=seeds)
    reference, _ = run_measured(
        gate_backend, prompts, replace(settings, split_policy=UNSPLIT_POLICY), seed_prompts=seeds
    )
    lengths = [p.num_prompt_tokens for p in prompts]
    steps = split_steps(candidate, lengths)
    verdict = judge(golden, f"gate1/{workload.name}", candidate, reference, profile, splits)
    shape_problem = workload.expect(steps, candidate)
    record_gate_result(
        afd_results,
        settings=settings,
        topology=topology,
        prompts=prompts,
        outputs=candidate,
        dataset=f"gate1/{workload.name}",
        seed=afd_options.seed,
        gate={
            "gate": 1,
            "case": workload.name,
            "reference": "same prompts, schedule and cached prefix with split_policy=none",
            "split_forwards": len(steps),
            "split_shapes": [step.__dict__ for step in steps],
            "shape_problem": shape_problem,
            "verdict": verdict.to_json(),
        },
    )
    assert [r.num_cached_tokens for r in candidate.requests] == [
        r.num_cached_tokens for r in reference.requests
    ], "candidate and reference must start from the same cached prefix"
    assert shape_problem is None, f"{workload.name}: {shape_problem}"
    verdict.raise_if_rejected()
