"""Gate 5: a soak of ``--afd-soak-forwards`` random batches that must leave nothing behind.

Many small ``Backend.run`` calls (through the backend protocol only) of 1-4
random prompts: chunked continuations and prefix hits (non-zero computed
tokens), token-balanced / request-boundary / unsplit policies under the
supported topologies' split constraints. The counts of what really ran come
from the runs' own step evidence and are recorded and asserted: truly split
forwards, cuts inside a request (partial-request cuts), those with computed
tokens, fallbacks and unsplit-policy steps (they are not split forwards).

Detectors (see ``soak_lib``):

* weak references to every step's plan, parent metadata and parts are dead
  after the run (a retained reference anywhere is a leak);
* the split invariants and parent-never-mutated hold for every split;
* allocated Python memory blocks and the gc object count grow by less than a bound,
  and traced bytes over the soak's last ~150 forwards;
* ``afd_split``'s and the executor's module globals are unchanged;
* a fixed probe batch run before and after is bit-identical;
* no hang: a watchdog bounds every step and the whole soak.

The soak model keeps one dense and one MoE layer of the reduced config: the
split path and its state handling are the same in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import soak_lib
from gate_lib import (
    SPLIT_POLICY,
    SUPPORTED_CPU_TOPOLOGIES,
    gate_settings,
    make_prompts,
    page_scale,
    record_gate_result,
)

from afd_split import plan_split
from pytest_afd.core.backend import (
    CAP_SPLIT_OBSERVER,
    PromptRequest,
     observe_splits,
    require_capability,
)
from pytest_afd.faults.registry import get_fault
from pytest_afd.topology.spec import parse_topology

MAX_SHOWN_PROBLEMS = 5
SOAK_MODEL = "reduced:num_hidden_layers=2,first_k_dense_replace=1"
SOAK_TOPOLOGY = SUPPORTED_CPU_TOPOLOGIES[0]
STEP_TIMEOUT_S = 60.0
SOAK_TIMEOUT_S = 900.0
WARMUP_RUNS = 10
MAX_BATCH_REQUESTS = 4
MAX_PROMPT_TOKENS = 60
PREFIX_TOKENS = 32
CHUNK_SIZES = (None, 16, 32)
POLICIES = ("token_balanced", "request_boundary", "none")
POLICY_WEIGHTS = (0.7, 0.15, 0.15)
PREFIX_PROBABILITY = 0.3
MIN_SPLIT_FRACTION = 0.5
MIN_PARTIAL_FRACTION = 0.25
MIN_PARTIAL_WITH_COMPUTED_FRACTION = 0.1
"""Of the forwards, cuts inside a request with computed tokens (50 at 500 forwards, as the
fixed bound was; seeds 0-5 at 250 forwards: 26-45 %)."""
# Bounds on growth (after gc.collect()). Clean soaks: blocks 98-438 (seeds 0-3, ~1,000
# forwards) and 130-453 (seeds 0-5, 250: warm-up, not length), gc objects -2..1 at every
# length, and 51-68 kB traced over the last ~150 (long-lived objects re-allocated under
# tracing). Keeping every forward's metadata adds ~15 blocks and 2 gc objects per
# forward; a buffer kept per forward is seen by the window from ~1.7 kB a forward.
MAX_ALLOCATED_BLOCK_GROWTH = 2048
MAX_GC_OBJECT_GROWTH = 100
TRACED_FORWARDS = 150
"""The soak's last forwards traced by ``tracemalloc`` (buffers above 512 B are no block)."""
MAX_TRACED_GROWTH_BYTES = 256 * 1024
PROBE_LENGTHS = (7, 12, 5)
PROBE_SEED_OFFSET = 5
LEAK_SOAK_STEPS = 60
REFERENCE_LEAK_STEPS = 20
"""Forwards of a reference-leak case: the weak references see a kept plan after any run."""


@dataclass
class SoakOutcome:
    counts: soak_lib.StepCounts
    memory: soak_lib.MemoryProbe
    leaks: list[str]
    violations: list[str]
    module_changes: list[str]
    probe_identical: bool | None
    hang: str | None
    error: BaseException | None
    runs: int

    def problems(self) -> list[str]:
        found = [f"leak: {leak}" for leak in self.leaks[:3]]
        found += [f"invariant: {v}" for v in self.violations[:3]]
        found += [f"module state: {c}" for c in self.module_changes[:5]]
        if self.memory.blocks_growth > MAX_ALLOCATED_BLOCK_GROWTH:
            found.append(f"allocated memory blocks grew {self.memory.blocks_growth} "
                         f"(bound {MAX_ALLOCATED_BLOCK_GROWTH})")
        if self.memory.traced_bytes > MAX_TRACED_GROWTH_BYTES:
            found.append(f"traced memory grew {self.memory.traced_bytes} B over the last "
                         f"{self.memory.traced_forwards} forwards "
                         f"(bound {MAX_TRACED_GROWTH_BYTES})")
        if self.memory.objects_growth > MAX_GC_OBJECT_GROWTH:
            found.append(f"gc objects grew {self.memory.objects_growth} "
                         f"(bound {MAX_GC_OBJECT_GROWTH})")
        if self.probe_identical is False:
            found.append("the probe batch's outputs changed across the soak")
        return found


def soak_constraints() -> list[tuple[int, int]]:
    emulations = [parse_topology(s).cpu_emulation() for s in SUPPORTED_CPU_TOPOLOGIES]
    return sorted({(e.split_align, e.pcp_size) for e in emulations})


def random_run(rng: np.random.Generator, index: int, pages, constraints):
    """(seed runs, prompts, settings) of one random soak run."""
    size = int(rng.integers(1, MAX_BATCH_REQUESTS + 1))
    lengths = [int(n) for n in rng.integers(1, MAX_PROMPT_TOKENS + 1, size)]
    prompts = make_prompts(lengths, int(rng.integers(1 << 30)), tag=f"s{index}-")
    align, pcp = constraints[int(rng.integers(len(constraints)))]
    chunk = CHUNK_SIZES[int(rng.integers(len(CHUNK_SIZES)))]
    prefix_hit = bool(rng.random() < PREFIX_PROBABILITY)
    settings = gate_settings(
        parse_topology(SOAK_TOPOLOGY), pages,
        split_policy=str(rng.choice(POLICIES, p=POLICY_WEIGHTS)), chunk_size=chunk,
        prefix_caching=prefix_hit, split_align=align, pcp_size=pcp,
    )  # fmt: skip
    seeds = []
    if prefix_hit:
        prefix = make_prompts([PREFIX_TOKENS], int(rng.integers(1 << 30)), tag="x")[0]
        seeds = [[PromptRequest(f"seed{index}", (*prefix.prompt_token_ids, 1))]]
        prompts = [PromptRequest(p.request_id, prefix.prompt_token_ids + p.prompt_token_ids)
                   for p in prompts]
    return seeds, prompts, settings


def run_probe(backend, pages, seed: int):
    settings = gate_settings(parse_topology(SOAK_TOPOLOGY), pages, split_policy=SPLIT_POLICY)
    backend.reset_prefix_cache()
    outputs = backend.run(make_prompts(PROBE_LENGTHS, seed, tag="probe"), settings)
    assert any(s["boundary_request"] is not None for s in outputs.steps), (
        "the probe must cut inside a request"
    )
    return outputs


def probe_identical(before, after) -> bool:
    return (
        all(np.array_equal(a.logits, b.logits) and a.next_token == b.next_token
            for a, b in zip(before.requests, after.requests, strict=True))
        and before.expert_load == after.expert_load
    )  # fmt: skip


def soak(backend, pages, seed: int, steps: int, traced_forwards: int = TRACED_FORWARDS,
         warmup_runs: int = WARMUP_RUNS) -> SoakOutcome:
    """Run random batches until ``steps`` forwards ran; every detector armed, the traced
    window over the last ``traced_forwards``. The reference-leak cases take no window
    and no warm-up (``0``): they assert the weak references and the module scan only."""
    require_capability(backend, CAP_SPLIT_OBSERVER)
    rng = np.random.default_rng(seed)
    constraints = soak_constraints()
    log = soak_lib.WeakSplitLog()
    counts, memory, leaks = soak_lib.StepCounts(), soak_lib.MemoryProbe(), []
    progress = soak_lib.SoakProgress()
    probe_seed = seed + PROBE_SEED_OFFSET
    runs = [0]

    def one_run(index: int) -> list[dict]:
        seeds, prompts, settings = random_run(rng, index, pages, constraints)
        backend.reset_prefix_cache()
        steps_seen = []
        for seed_prompts in seeds:
            steps_seen += backend.run(seed_prompts, settings).steps
        steps_seen += backend.run(prompts, settings).steps
        alive = log.alive_after_run()
        if alive:
            leaks.append(f"run {index}: still referenced after the run: {alive[:3]}")
        return steps_seen

    def body(progress: soak_lib.SoakProgress) -> None:
        for index in range(warmup_runs):
            one_run(-1 - index)
        memory.start()
        while counts.forwards < steps:
            if (traced_forwards and not memory.tracing
                    and counts.forwards >= steps - traced_forwards):
                memory.trace(counts.forwards)
            counts.add(one_run(runs[0]))
            runs[0] += 1
            progress.steps_done = counts.forwards
            progress.last_progress = soak_lib.time.monotonic()
        memory.stop(counts.forwards)

    with observe_splits(backend, log):
        before = run_probe(backend, pages, probe_seed)
        log.alive_after_run()
        state_before = soak_lib.module_state()
        try:
            hang = soak_lib.run_watched(
                body, progress, step_timeout_s=STEP_TIMEOUT_S, soak_timeout_s=SOAK_TIMEOUT_S
            )
        finally:
            memory.close()  # a failed or hung soak never leaves tracing on
        done = hang is None and progress.error is None
        after = run_probe(backend, pages, probe_seed) if done else None
        state_after = soak_lib.module_state()
    return SoakOutcome(
        counts=counts, memory=memory, leaks=leaks, violations=log.violations,
        module_changes=soak_lib.module_state_changes(state_before, state_after),
        probe_identical=None if after is None else probe_identical(before, after),
        hang=hang, error=progress.error, runs=runs[0],
    )  # fmt: skip


@pytest.fixture
def soak_backend(gate_backends):
    return gate_backends.get(SOAK_TOPOLOGY, SOAK_MODEL)


@pytest.mark.gate
def test_gate_5_soak_mixed_partial_splits(soak_backend, gate_backends, afd_options, afd_results):
    pages = page_scale(afd_options.backend)
    steps = afd_options.soak_forwards  # --afd-soak-forwards (the nightly's is longer)
    outcome = soak(soak_backend, pages, afd_options.seed, steps)
    counts = outcome.counts
    record_gate_result(
        afd_results,
        manifest=gate_backends.manifest(SOAK_TOPOLOGY, SOAK_MODEL),
        settings=gate_settings(parse_topology(SOAK_TOPOLOGY), pages, split_policy=SPLIT_POLICY),
        topology=parse_topology(SOAK_TOPOLOGY),
        prompts=make_prompts(PROBE_LENGTHS, afd_options.seed + PROBE_SEED_OFFSET, tag="probe"),
        outputs=None,
        dataset="gate5/random-soak",
        seed=afd_options.seed,
        gate={
            "gate": 5,
            "model": SOAK_MODEL,
            "steps_requested": steps,
            "runs": outcome.runs,
            **counts.to_json(),
            "hang": outcome.hang,
            "error": None if outcome.error is None else repr(outcome.error),
            "leaks": outcome.leaks[:10],
            "invariant_violations": outcome.violations[:10],
            "module_state_changes": outcome.module_changes[:10],
            "allocated_block_growth": outcome.memory.blocks_growth,
            "gc_object_growth": outcome.memory.objects_growth,
            "traced_memory_growth_bytes": outcome.memory.traced_bytes,
            "traced_forwards": outcome.memory.traced_forwards,
            "bounds": {"allocated_blocks": MAX_ALLOCATED_BLOCK_GROWTH,
                       "traced_memory_bytes": MAX_TRACED_GROWTH_BYTES,
                       "gc_objects": MAX_GC_OBJECT_GROWTH},
            "probe_bit_identical": outcome.probe_identical,
        },
    )  # fmt: skip
    assert outcome.hang is None, f"soak hang: {outcome.hang}"
    if outcome.error is not None:
        raise outcome.error
    assert not outcome.problems(), outcome.problems()
    assert counts.forwards >= steps
    assert not counts.count_problems, counts.count_problems[:MAX_SHOWN_PROBLEMS]
    assert counts.split >= MIN_SPLIT_FRACTION * counts.forwards, counts.to_json()
    assert counts.partial_request >= MIN_PARTIAL_FRACTION * counts.forwards, counts.to_json()
    assert (counts.partial_with_computed
            >= MIN_PARTIAL_WITH_COMPUTED_FRACTION * counts.forwards), counts.to_json()


@pytest.mark.gate
@pytest.mark.parametrize("leak", ["retained_reference", "executor_keeps_metadata"])
def test_gate_5_soak_sees_an_injected_leak(soak_backend, afd_options, leak):
    """Each leak of the issue, injected, is reported by the soak's detectors."""
    with get_fault(leak).applied():
        outcome = soak(soak_backend, page_scale(afd_options.backend), afd_options.seed,
                       REFERENCE_LEAK_STEPS, traced_forwards=0, warmup_runs=0)
    assert outcome.error is None and outcome.hang is None
    assert outcome.leaks, f"the weak references missed {leak}"
    if leak == "retained_reference":
        assert any("_retained_splits changed size" in c for c in outcome.module_changes)


@pytest.mark.gate
def test_gate_5_memory_bound_sees_a_leak_no_reference_shows(soak_backend, afd_options):
    """A leak of plain bytes (every forward's logits) escapes the weak references, the
    module scan, the gc count and the block count: the traced window alone reports it."""
    with get_fault("executor_keeps_logits_bytes").applied():
        outcome = soak(soak_backend, page_scale(afd_options.backend), afd_options.seed,
                       LEAK_SOAK_STEPS)
    assert outcome.error is None and outcome.hang is None
    assert outcome.memory.traced_forwards >= LEAK_SOAK_STEPS
    problems = outcome.problems()
    assert len(problems) == 1 and problems[0].startswith("traced memory grew"), problems


@pytest.mark.gate
def test_gate_5_block_count_sees_small_objects_gc_does_not_track():
    """Small objects gc does not track (tuples of ints, once collected) grow the block
    count past its bound and leave the gc count alone."""
    probe = soak_lib.MemoryProbe()
    probe.start()
    kept = [tuple(range(n, n + 3)) for n in range(1000, 1000 + 2 * MAX_ALLOCATED_BLOCK_GROWTH)]
    probe.stop(0)
    assert probe.blocks_growth > MAX_ALLOCATED_BLOCK_GROWTH, probe
    assert probe.objects_growth < len(kept) // 100, probe


@pytest.mark.gate
def test_gate_5_gc_count_sees_one_tracked_object_a_forward_at_the_shortest_default(afd_options):
    """The pre-merge soak is shorter than the nightly's: one gc-tracked object kept per
    forward, over the configured soak length, still grows the gc count past its bound."""
    probe = soak_lib.MemoryProbe()
    probe.start()
    kept = [[forward] for forward in range(afd_options.soak_forwards)]  # one list a forward
    probe.stop(len(kept))
    assert probe.objects_growth > MAX_GC_OBJECT_GROWTH, (probe, afd_options.soak_forwards)


@pytest.mark.gate
def test_gate_5_detectors_see_contamination():
    """A module global that grows, a rebound one and a leftover reference are each reported."""
    holder = soak_lib.WeakSplitLog()

    kept = plan_split([5, 3], policy="token_balanced")  # a record: no weak reference of its own
    holder.refs.append(("kept plan", soak_lib.lifetime_ref(kept)))
    assert holder.alive_after_run() == ["kept plan"]
    gone = plan_split([5, 3], policy="token_balanced")
    holder.refs.append(("dropped plan", soak_lib.lifetime_ref(gone)))
    del gone
    assert holder.alive_after_run() == []
    twice = plan_split([5, 3], policy="token_balanced")  # one plan logged under two labels
    holder.refs += [("first", soak_lib.lifetime_ref(twice)), ("second", soak_lib.lifetime_ref(twice))]
    assert holder.alive_after_run() == ["first", "second"]
    module = soak_lib.sys.modules["afd_split.plan.planner"]
    before = soak_lib.module_state(["afd_split.plan.planner"])
    module.soak_probe_cache = []
    try:
        assert soak_lib.module_state_changes(before, soak_lib.module_state(["afd_split.plan.planner"])) == [
            "added afd_split.plan.planner.soak_probe_cache"
        ]
        with_list = soak_lib.module_state(["afd_split.plan.planner"])
        module.soak_probe_cache.append(kept)
        changes = soak_lib.module_state_changes(with_list, soak_lib.module_state(["afd_split.plan.planner"]))
        assert changes == ["afd_split.plan.planner.soak_probe_cache changed size 0 -> 1"]
    finally:
        del module.soak_probe_cache


@pytest.mark.gate
def test_gate_5_watchdog_reports_a_stalled_step():
    """The soak's hang detector fires on a worker that stops making progress."""
    release = soak_lib.threading.Event()
    progress = soak_lib.SoakProgress(steps_done=7)
    try:
        hang = soak_lib.run_watched(lambda p: release.wait(), progress, step_timeout_s=0.2,
                                    soak_timeout_s=60)
    finally:
        release.set()
    assert hang is not None and "step 7 made no progress" in hang
