"""Gate 1: token-balanced and unsplit outputs match within tolerance on every supported topology.

Each case runs the same prompts twice through the backend, once with the
token-balanced split and once unsplit (``split_policy="none"``), with the same
schedule and the same cached prefix, and compares last-token logits under the
model's tolerance profile. The split shape the case is about (a cut inside
one long request, on a request boundary, inside a prefix-hit request, inside a
partial chunk) is asserted from the run's own step evidence, not assumed.

On the CPU backend the AFD topologies also run through the CPU AFD runtime
(Attention and FFN as separate processes, gloo point-to-point): the same batch
shapes, token-split there, against the unsplit in-process executor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pytest
from gate_lib import (
    SPLIT_POLICY,
    TOLERANCE_PROFILES,
    UNSPLIT_POLICY,
    ExecutedSplits,
    PageScale,
    SplitStep,
    gate_settings,
    judge,
    make_prompts,
    record_gate_result,
    record_reference_case,
    run_measured,
    shape_unverified,
    split_steps,
)

from afd_split import (
    BatchMetadata,
    SplitConstraints,
    SplitInvariantError,
    plan_split,
    split_metadata,
    validate_split,
)
from pytest_afd.backends.base import PromptRequest, RequestOutput, RunOutputs
from pytest_afd.backends.cpu import Executor, PagedKVCache, build_model, named_config
from pytest_afd.topology import parse_topology

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
    gate_topology_obj,
    gate_quantization,
    gate_backend,
    gate_pages,
    workload,
    golden,
    gate_references,
    afd_results,
    afd_options,
):
    topology = gate_topology_obj
    quantization = gate_quantization
    profile = TOLERANCE_PROFILES[quantization]
    settings = gate_settings(
        topology,
        gate_pages,
        split_policy=SPLIT_POLICY,
        quantization=quantization,
        chunk_size=gate_pages.tokens(workload.chunk_size),
        prefix_caching=bool(workload.shared_prefix),
    )
    prompts, seeds = workload.prompts(afd_options.seed, gate_pages)
    stored = gate_references.name(f"gate1/{workload.name}", topology.canonical, quantization)
    if gate_references.recording:
        record_reference_case(
            afd_results, gate_references, stored, gate_backend, prompts, settings,
            topology=topology, gate={"gate": 1, "case": workload.name},
            dataset=f"gate1/{workload.name}", seed=afd_options.seed,
        )  # fmt: skip
        return
    candidate, splits = run_measured(
        gate_backend, prompts, settings, seed_prompts=seeds,
        seed_split=gate_references.seed_split(settings),
    )
    if gate_references.checking:
        reference = gate_references.load(stored, prompts, settings)
    else:
        reference, _ = run_measured(
            gate_backend, prompts, replace(settings, split_policy=UNSPLIT_POLICY),
            seed_prompts=seeds,
        )  # fmt: skip
    lengths = [p.num_prompt_tokens for p in prompts]
    steps = split_steps(candidate, lengths)
    verdict = judge(golden, f"gate1/{workload.name}", candidate, reference, profile, splits)
    unverified = shape_unverified(candidate)
    shape_problem = None if unverified else workload.expect(steps, candidate)
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
            "reference": gate_references.describe(stored) if gate_references.checking
            else "same prompts, schedule and cached prefix with split_policy=none",
            "split_forwards": len(steps),
            "split_shapes": [step.__dict__ for step in steps],
            "shape_problem": shape_problem,
            "shape_unverified": unverified,
            "verdict": verdict.to_json(),
        },
    )
    if gate_references.live:  # a stored reference is uncached by definition
        assert [r.num_cached_tokens for r in candidate.requests] == [
            r.num_cached_tokens for r in reference.requests
        ], "candidate and reference must start from the same cached prefix"
    assert shape_problem is None, f"{workload.name}: {shape_problem}"
    verdict.raise_if_rejected()


# ---- the AFD topology: Attention and FFN as separate processes ------------------------


@dataclass(frozen=True)
class AfdCase:
    """Executor-level batch: earlier unsplit forwards (cache fill), then the measured forward.

    Pieces are (request, first position, tokens) of the prompts ``lengths``.
    """

    name: str
    lengths: tuple[int, ...]
    measured: tuple[tuple[int, int, int], ...]
    expect: Callable[[list[SplitStep], RunOutputs], str | None]
    earlier: tuple[tuple[int, int, int], ...] = ()
    # The earlier forwards stand for a prefix-cache hit (else: earlier chunks).
    earlier_is_prefix_hit: bool = False


AFD_CASES = (
    AfdCase("one_long_request", (300,), ((0, 0, 300),), cut_inside_a_request),
    AfdCase("unequal_requests", (150, 37, 260), ((0, 0, 150), (1, 0, 37), (2, 0, 260)),
            cut_inside_a_request),
    AfdCase("cut_on_request_boundary", (128, 64, 64), ((0, 0, 128), (1, 0, 64), (2, 0, 64)),
            cut_on_request_boundaries),
    AfdCase("prefix_hit_nonzero_computed", (40, 246), ((0, 0, 40), (1, 96, 150)),
            cut_inside_a_prefix_hit, earlier=((1, 0, 96),), earlier_is_prefix_hit=True),
    AfdCase("chunked_partial_query", (150, 40), ((0, 64, 64), (1, 0, 40)),
            cut_inside_a_partial_chunk, earlier=((0, 0, 64),)),
)  # fmt: skip


def piece_batch(prompts, pieces, block_size):
    """Token ids and metadata of one forward; request r owns blocks [r * width, (r+1) * width)."""
    width = -(-max(p.num_prompt_tokens for p in prompts) // block_size)
    requests = [r for r, _, _ in pieces]
    table = np.array([np.arange(r * width, (r + 1) * width) for r in requests])
    metadata = BatchMetadata.from_requests(
        [n for _, _, n in pieces], [s for _, s, _ in pieces], table, block_size
    )
    ids = np.concatenate([prompts[r].prompt_token_ids[s : s + n] for r, s, n in pieces])
    return ids, metadata


def as_run_outputs(prompts, pieces, logits, plan, metadata, cached_tokens) -> RunOutputs:
    """The measured forward in the backend protocol's shape, so gate 1's judge applies."""
    requests = [
        RequestOutput(
            request_id=prompts[r].request_id,
            num_prompt_tokens=prompts[r].num_prompt_tokens,
            num_cached_tokens=cached_tokens.get(r, 0),
            next_token=int(np.argmax(row)),
            logits=np.asarray(row, dtype=np.float32),
        )
        for (r, _, _), row in zip(pieces, logits, strict=True)
    ]
    schedule = {
        "requests": [r for r, _, _ in pieces],
        "num_scheduled_tokens": [n for _, _, n in pieces],
        "num_computed_tokens": np.asarray(metadata.num_computed_tokens).tolist(),
    }
    return RunOutputs(requests=requests, steps=[{**plan.to_evidence(), "schedule": schedule}])


@pytest.fixture(scope="module")
def afd_runtime(afd_options):
    """One Attention + one FFN process (the CPU emulation of every AFD topology here)."""
    from pytest_afd.backends.cpu.afd import AfdRuntime

    config = named_config(afd_options.model)
    with AfdRuntime(config, afd_options.seed, num_attention=1, num_ffn=1) as runtime:
        yield runtime


@pytest.fixture(scope="module")
def reference_model(afd_options):
    return build_model(named_config(afd_options.model), afd_options.seed)


def executor_reference(model, prompts, case: AfdCase, block_size):
    """The measured forward unsplit, in-process, after the same earlier forwards."""
    executor = Executor(model, PagedKVCache(model.config, block_size))
    for pieces in [(piece,) for piece in case.earlier] + [case.measured]:
        ids, metadata = piece_batch(prompts, pieces, block_size)
        executor.kv_cache.ensure_blocks(int(metadata.block_table.max()) + 1)
        output = executor.execute(ids, metadata)
    return output.last_logits.numpy(), metadata


@pytest.mark.gate
@pytest.mark.parametrize("case", AFD_CASES, ids=lambda c: c.name)
def test_gate_1_afd_runtime_split_matches_unsplit(
    gate_afd_topology,
    gate_pages,
    afd_runtime,
    reference_model,
    case,
    golden,
    afd_results,
    afd_options,
):
    """The token split through the AFD process pair vs the unsplit in-process executor."""
    topology = parse_topology(gate_afd_topology, afd_options.aliases)
    settings = gate_settings(topology, gate_pages, split_policy=SPLIT_POLICY)
    constraints = SplitConstraints(align=settings.split_align, pcp_size=settings.pcp_size)
    prompts = make_prompts(case.lengths, afd_options.seed)
    block_size = settings.block_size
    reference_logits, metadata = executor_reference(reference_model, prompts, case, block_size)
    afd_runtime.reset_kv_cache()
    for piece in case.earlier:
        ids, earlier = piece_batch(prompts, (piece,), block_size)
        afd_runtime.run_forward(ids, earlier, plan_split([piece[2]], policy=UNSPLIT_POLICY))
    ids, metadata = piece_batch(prompts, case.measured, block_size)
    plan = plan_split(
        np.diff(metadata.query_start_loc), policy=SPLIT_POLICY, constraints=constraints,
        num_computed_tokens=metadata.num_computed_tokens,
    )  # fmt: skip
    splits = ExecutedSplits(plans=[plan])
    try:  # the ranks split in their own process; check the same split here
        validate_split(plan, metadata, split_metadata(plan, metadata))
    except SplitInvariantError as error:
        splits.violations.append(str(error))
    result = afd_runtime.run_forward(
        ids, metadata, plan, logits_rows=np.asarray(metadata.query_start_loc[1:]) - 1
    )
    cached = {r: s for r, s, _ in case.measured} if case.earlier_is_prefix_hit else {}
    candidate = as_run_outputs(prompts, case.measured, result.logits, plan, metadata, cached)
    reference = as_run_outputs(prompts, case.measured, reference_logits, plan, metadata, cached)
    lengths = [p.num_prompt_tokens for p in prompts]
    steps = split_steps(candidate, lengths)
    verdict = judge(golden, f"gate1/afd/{case.name}", candidate, reference, "float32", splits)
    shape_problem = case.expect(steps, candidate)
    record_gate_result(
        afd_results,
        settings=settings,
        topology=topology,
        prompts=prompts,
        outputs=candidate,
        dataset=f"gate1/afd/{case.name}",
        seed=afd_options.seed,
        gate={
            "gate": 1,
            "case": case.name,
            "runtime": afd_runtime.describe(),
            "reference": "in-process executor, unsplit, after the same earlier forwards",
            "split_shapes": [step.__dict__ for step in steps],
            "shape_problem": shape_problem,
            "afd_evidence": result.evidence,
            "verdict": verdict.to_json(),
        },
    )
    assert shape_problem is None, f"{case.name}: {shape_problem}"
    verdict.raise_if_rejected()
