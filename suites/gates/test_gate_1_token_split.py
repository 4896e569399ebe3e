"""Gate 1: token-balanced and unsplit outputs match within tolerance on every supported topology.

Each case runs the same prompts twice through the backend, once with the
token-balanced split and once unsplit (``split_policy="none"``), with the same
schedule and the same cached prefix, and compares last-token logits under the
model's tolerance profile. The split shape the case is about (a cut inside
one long request, on a request boundary, inside a prefix-hit request, inside a
partial chunk) is asserted from the run's own step evidence, not assumed.

The reference is a direct whole-batch forward (``split_policy="none"`` never
enters afd_split's slicing, gather or merge), so a bug there cannot corrupt both
sides alike. On a backend with capability ``afd`` the AFD topologies also run
with ``afd_processes`` (Attention and FFN as separate processes): the same
batch shapes, token-split there, against the in-process unsplit forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import pytest
from gate_lib import (
    SPLIT_POLICY,
    UNSPLIT_POLICY,
    PageScale,
    SplitStep,
    gate_settings,
    make_prompts,
    shape_unverified,
    split_steps,
    step_derived,
)
from step_evidence_checks import agreement_problems, steps_count_problems

from afd_split.checks.request_checks import LIST_CHECK_MAX_REQUESTS
from pytest_afd.core.backend import (
    CAP_AFD,
    PromptRequest,
    RunOutputs,
    RunSettings,
    require_capability,
)
from pytest_afd.topology.spec import parse_topology

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


def cut_inside_a_request_of_many(steps: list[SplitStep], outputs: RunOutputs) -> str | None:
    if any(s.boundary_request is not None and len(s.requests) > LIST_CHECK_MAX_REQUESTS
           for s in steps):
        return None
    return (f"no forward of more than {LIST_CHECK_MAX_REQUESTS} requests was cut inside a "
            f"request (splits {steps})")


@dataclass(frozen=True)
class SplitWorkload:
    name: str
    lengths: tuple[int, ...]
    expect: Callable[[list[SplitStep], RunOutputs], str | None]
    shared_prefix: int = 0  # requests listed in prefixed get this many shared tokens, seeded first
    prefixed: tuple[int, ...] = ()
    chunk_size: int | None = None
    max_num_seqs: int | None = None  # None: RunSettings' default

    def prompts(
        self, seed: int, pages: PageScale
    ) -> tuple[list[PromptRequest], list[list[PromptRequest]]]:
        """(measured prompts, seed runs that put the shared prefix in the cache)."""
        prefix_tokens = pages.tokens(self.shared_prefix)
        prefix = [p.prompt_token_ids for p in make_prompts([prefix_tokens], seed, tag="p")]
        own = make_prompts(pages.lengths(self.lengths), seed + 1)
        prompts = [
            replace(p, prompt_token_ids=prefix[0] + p.prompt_token_ids) if i in self.prefixed else p
            for i, p in enumerate(own)
        ]
        if not self.shared_prefix:
            return prompts, []
        suffix = pages.tokens(PREFIX_SEED_SUFFIX)
        seed_prompt = make_prompts([suffix], seed + 2, prefix=prefix[0], tag="seed")
        return prompts, [seed_prompt]


# Above afd_split.checks.request_checks.LIST_CHECK_MAX_REQUESTS (32): the request check's bytes
# path runs. Small requests keep the CPU forward cheap; the cut falls inside the 60.
MANY_SMALL_REQUESTS = (3,) * 20 + (60,) + (3,) * 20

WORKLOADS = (
    SplitWorkload("one_long_request", (300,), cut_inside_a_request),
    SplitWorkload("many_small_requests", MANY_SMALL_REQUESTS, cut_inside_a_request_of_many,
                  max_num_seqs=len(MANY_SMALL_REQUESTS)),
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
    gate_topology_obj, gate_quantization, gate_backend, gate_manifest, gate_pages, workload,
    gate_case, afd_options,
):
    settings = gate_settings(
        gate_topology_obj,
        gate_pages,
        split_policy=SPLIT_POLICY,
        quantization=gate_quantization,
        chunk_size=gate_pages.tokens(workload.chunk_size),
        prefix_caching=bool(workload.shared_prefix),
        max_num_seqs=workload.max_num_seqs or RunSettings.max_num_seqs,
    )
    prompts, seeds = workload.prompts(afd_options.seed, gate_pages)
    run = gate_case.run(
        gate=1, case=workload.name, name=f"gate1/{workload.name}",
        dataset=f"gate1/{workload.name}", backend=gate_backend, manifest=gate_manifest,
        topology=gate_topology_obj, quantization=gate_quantization, prompts=prompts,
        settings=settings, seed_prompts=seeds,
        reference_settings=replace(settings, split_policy=UNSPLIT_POLICY),
        reference_seed_prompts=seeds,
        live_reference="same prompts, schedule and cached prefix with split_policy=none",
    )  # fmt: skip
    if run is None:  # the reference phase
        return
    candidate, reference = run.candidate, run.reference
    steps = split_steps(candidate, [p.num_prompt_tokens for p in prompts])
    unverified = shape_unverified(candidate)
    shape_problem = None if unverified else workload.expect(steps, candidate)
    count_problems = steps_count_problems(candidate.steps, workload.name)
    gate_case.record(
        run,
        split_forwards=step_derived(candidate, len(steps)),
        split_shapes=step_derived(candidate, [step.__dict__ for step in steps]),
        shape_problem=shape_problem,
        shape_unverified=unverified,
        step_count_problems=count_problems,
    )
    if gate_case.live:  # a stored reference is uncached by definition
        assert [r.num_cached_tokens for r in candidate.requests] == [
            r.num_cached_tokens for r in reference.requests
        ], "candidate and reference must start from the same cached prefix"
    assert shape_problem is None, f"{workload.name}: {shape_problem}"
    assert not count_problems, count_problems
    run.verdict.raise_if_rejected()


# ---- the AFD topology: Attention and FFN as separate processes ------------------------

# The split shapes the AFD process pair must reproduce (the in-process workloads'
# names); each runs through Backend.run with ``afd_processes`` on.
AFD_WORKLOADS = tuple(
    w for w in WORKLOADS
    if w.name in ("one_long_request", "many_small_requests", "unequal_requests",
                  "cut_on_request_boundary", "prefix_hit_nonzero_computed",
                  "chunked_partial_query")
)  # fmt: skip


@pytest.mark.gate
@pytest.mark.parametrize("workload", AFD_WORKLOADS, ids=lambda w: w.name)
def test_gate_1_afd_runtime_split_matches_unsplit(
    gate_afd_topology, gate_backends, gate_pages, workload, gate_case, afd_options
):
    """The token split on separate Attention/FFN processes vs the unsplit in-process forward.

    Both sides go through the backend protocol: the candidate with
    ``afd_processes=True`` (capability ``afd``), the reference as a direct
    whole-batch in-process forward, same prompts, schedule and cached prefix.
    """
    backend = gate_backends.get(gate_afd_topology)
    require_capability(backend, CAP_AFD)
    topology = parse_topology(gate_afd_topology, afd_options.aliases)
    settings = gate_settings(
        topology,
        gate_pages,
        split_policy=SPLIT_POLICY,
        chunk_size=gate_pages.tokens(workload.chunk_size),
        prefix_caching=bool(workload.shared_prefix),
        max_num_seqs=workload.max_num_seqs or RunSettings.max_num_seqs,
        afd_processes=True,
    )
    prompts, seeds = workload.prompts(afd_options.seed, gate_pages)
    # No stored reference: the reference is another deployment (in-process), live in any phase.
    run = gate_case.run(
        gate=1, case=workload.name, name=f"gate1/afd/{workload.name}",
        dataset=f"gate1/afd/{workload.name}", backend=backend,
        manifest=gate_backends.manifest(gate_afd_topology), topology=topology,
        quantization=settings.quantization, profile="float32", prompts=prompts,
        settings=settings, seed_prompts=seeds, stored=False,
        reference_settings=replace(settings, split_policy=UNSPLIT_POLICY, afd_processes=False),
        reference_seed_prompts=seeds,
        live_reference="in-process direct whole-batch forward (split_policy=none), same "
        "prompts, schedule and cached prefix",
    )  # fmt: skip
    candidate = run.candidate
    steps = split_steps(candidate, [p.num_prompt_tokens for p in prompts])
    shape_problem = workload.expect(steps, candidate)
    count_problems = steps_count_problems(candidate.steps, f"afd/{workload.name}")
    count_problems += agreement_problems(candidate.steps, f"afd/{workload.name}")
    gate_case.record(
        run,
        split_shapes=[step.__dict__ for step in steps],
        shape_problem=shape_problem,
        step_count_problems=count_problems,
    )
    assert shape_problem is None, f"{workload.name}: {shape_problem}"
    assert not count_problems, count_problems
    run.verdict.raise_if_rejected()
