"""Gate 5: a 1,000-step soak of mixed lengths and partial-request splits on one executor.

One CPU executor instance runs 1,000 consecutive forwards of tiny random
batches: new requests and chunk continuations (non-zero computed tokens),
token-balanced / request-boundary / unsplit plans under the supported
topologies' split constraints, so most forwards cut inside a request. After
every step:

* no hang: each step must finish within a watchdog bound (the soak runs in a
  worker thread; the test never waits unboundedly);
* no collective mismatch: the plan an independent re-derivation (another
  rank) makes from the same inputs has the same fingerprint ``agree_on_split``
  all-gathers;
* the split metadata the executor consumed passes the invariant checker;
* no metadata leakage: every attribute of the executor, model, layers and KV
  cache equals that of a freshly built executor (the CPU executor keeps its
  per-ubatch forward state in locals, so anything left behind shows up as an
  added or rebound attribute), and the forward wrote KV only to its own slots.

A fixed probe batch run before and after the soak must give bit-identical
logits, tokens and expert load (no state contamination).

The soak model keeps one dense and one MoE layer of the reduced config: the
split path and its state handling are the same in every layer, so depth would
add time, not coverage.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from gate_lib import (
    CPU_BACKEND,
    GATE_BLOCK_SIZE,
    SPLIT_POLICY,
    SUPPORTED_CPU_TOPOLOGIES,
    ExecutedSplits,
    checked_splits,
    gate_settings,
    make_prompts,
    page_scale,
    record_gate_result,
)

from afd_split import BatchMetadata, SplitConstraints, plan_split
from pytest_afd.backends.cpu import Executor, PagedKVCache, build_model, named_config
from pytest_afd.topology import parse_topology

SOAK_STEPS = 1000
SOAK_MODEL = "reduced"
SOAK_LAYER_OVERRIDES = {"num_hidden_layers": 2, "first_k_dense_replace": 1}
# A tiny forward takes ~20 ms here; a step that makes no progress for this long hangs.
STEP_TIMEOUT_S = 30.0
SOAK_TIMEOUT_S = 300.0
WATCHDOG_POLL_S = 0.2
MAX_BATCH_REQUESTS = 4
MAX_LIVE_REQUESTS = 6
MAX_PROMPT_TOKENS = 40
MAX_PIECE_TOKENS = 16
CONTINUE_PROBABILITY = 0.5
POLICIES = ("token_balanced", "request_boundary", "none")
POLICY_WEIGHTS = (0.7, 0.15, 0.15)
MIN_PARTIAL_SPLIT_FRACTION = 0.25
MIN_CONTINUATION_SPLITS = 50
PROBE_LENGTHS = (7, 12, 5)
PROBE_SEED_OFFSET = 5
BLOCKS_PER_REQUEST = -(-MAX_PROMPT_TOKENS // GATE_BLOCK_SIZE)


def attribute_state(obj: Any) -> dict[str, Any]:
    """Every attribute of ``obj``: plain values by value, objects by identity."""
    plain = (int, float, str, bool, type(None))
    return {
        name: value if isinstance(value, plain) else ("id", id(value))
        for name, value in vars(obj).items()
    }


def executor_state(executor: Executor) -> dict[str, Any]:
    """What a forward could leave behind in the executor, its model, layers and KV cache."""
    return {
        "executor": attribute_state(executor),
        "model": attribute_state(executor.model),
        "layers": [attribute_state(layer) for layer in executor.model.layers],
        "kv_cache": attribute_state(executor.kv_cache),
    }


def first_difference(actual: dict, expected: dict) -> str:
    for part in expected:
        if actual[part] != expected[part]:
            return f"{part}: {actual[part]} != fresh {expected[part]}"
    return ""


@dataclass(eq=False)
class LiveRequest:
    tokens: np.ndarray
    blocks: list[int]
    computed: int = 0


@dataclass
class SoakProgress:
    """Shared between the soak thread and the watchdog."""

    steps_done: int = 0
    last_progress: float = field(default_factory=time.monotonic)
    error: BaseException | None = None
    finished: bool = False
    records: list[dict[str, Any]] = field(default_factory=list)


class Soak:
    """Random tiny batches on one executor, every step checked."""

    def __init__(self, executor: Executor, rng: np.random.Generator, constraints, blocks):
        self.executor = executor
        self.cache = executor.kv_cache
        self.rng = rng
        self.constraints = constraints
        self.free_blocks = list(blocks)
        self.live: list[LiveRequest] = []
        self.fresh_state = executor_state(Executor(executor.model, executor.kv_cache))

    def _new_request(self) -> LiveRequest:
        length = int(self.rng.integers(1, MAX_PROMPT_TOKENS + 1))
        blocks = [self.free_blocks.pop() for _ in range(BLOCKS_PER_REQUEST)]
        tokens = self.rng.integers(0, self.executor.model.config.vocab_size, length)
        return LiveRequest(tokens, blocks)

    def _batch(self) -> list[LiveRequest]:
        size = int(self.rng.integers(1, MAX_BATCH_REQUESTS + 1))
        batch = [r for r in self.live if self.rng.random() < CONTINUE_PROBABILITY][:size]
        while len(batch) < size and len(self.live) < MAX_LIVE_REQUESTS:
            request = self._new_request()
            self.live.append(request)
            batch.append(request)
        return batch or [self.live[0]]

    def step(self, index: int, splits: ExecutedSplits) -> dict[str, Any]:
        batch = self._batch()
        pieces = [
            int(self.rng.integers(1, min(MAX_PIECE_TOKENS, len(r.tokens) - r.computed) + 1))
            for r in batch
        ]
        computed = [r.computed for r in batch]
        table = np.array([r.blocks for r in batch])
        metadata = BatchMetadata.from_requests(pieces, computed, table, GATE_BLOCK_SIZE)
        ids = np.concatenate(
            [r.tokens[c : c + n] for r, c, n in zip(batch, computed, pieces, strict=True)]
        )
        policy = str(self.rng.choice(POLICIES, p=POLICY_WEIGHTS))
        constraints = self.constraints[int(self.rng.integers(len(self.constraints)))]
        plan = plan_split(
            pieces, policy=policy, constraints=constraints, allow_fallback=True,
            num_computed_tokens=computed,
        )  # fmt: skip
        other_rank = plan_split(
            list(pieces), policy=policy, constraints=constraints, allow_fallback=True,
            num_computed_tokens=list(computed),
        )  # fmt: skip
        assert other_rank.fingerprint() == plan.fingerprint(), f"step {index}: ranks disagree"
        kv_before = [self.cache.storage(i).clone() for i in range(len(self.executor.model.layers))]
        consumed = len(splits.plans)
        started = time.perf_counter()
        output = self.executor.execute(ids, metadata, plan)
        elapsed = time.perf_counter() - started
        assert len(splits.plans) == consumed + 1, f"step {index}: executor split count"
        assert not splits.violations, f"step {index}: {splits.violations}"
        assert torch.isfinite(output.last_logits).all(), f"step {index}: non-finite logits"
        leaked = first_difference(executor_state(self.executor), self.fresh_state)
        assert not leaked, f"step {index}: executor state differs from a fresh one: {leaked}"
        slots = set(np.asarray(metadata.slot_mapping).tolist())
        for layer, before in enumerate(kv_before):
            changed = (self.cache.storage(layer) != before).any(dim=1).nonzero().flatten()
            stray = sorted(set(changed.tolist()) - slots)
            assert not stray, f"step {index}: layer {layer} wrote KV outside its slots: {stray[:5]}"
        for request, n in zip(batch, pieces, strict=True):
            request.computed += n
        for request in [r for r in self.live if r.computed == len(r.tokens)]:
            self.live.remove(request)
            self.free_blocks.extend(request.blocks)
        return {
            "policy": policy,
            "is_split": plan.is_split,
            "partial_request_split": plan.boundary_request is not None,
            "boundary_computed": computed[plan.boundary_request]
            if plan.boundary_request is not None
            else None,
            "fallback": plan.fallback_reason is not None,
            "tokens": int(sum(pieces)),
            "step_s": elapsed,
        }


def run_probe(executor: Executor, probe_blocks: list[int], seed: int):
    prompts = make_prompts(PROBE_LENGTHS, seed, tag="probe")
    tokens = [np.array(p.prompt_token_ids) for p in prompts]
    per_request = BLOCKS_PER_REQUEST
    table = np.array(
        [probe_blocks[i * per_request : (i + 1) * per_request] for i in range(len(tokens))]
    )
    metadata = BatchMetadata.from_requests(PROBE_LENGTHS, None, table, GATE_BLOCK_SIZE)
    plan = plan_split(PROBE_LENGTHS, policy=SPLIT_POLICY)
    assert plan.boundary_request is not None, "the probe must cut inside a request"
    return executor.execute(np.concatenate(tokens), metadata, plan)


def soak_worker(soak: Soak, steps: int, splits: ExecutedSplits, progress: SoakProgress) -> None:
    try:
        for index in range(steps):
            progress.records.append(soak.step(index, splits))
            progress.steps_done = index + 1
            progress.last_progress = time.monotonic()
    except BaseException as error:  # handed to the test thread
        progress.error = error
    finally:
        progress.finished = True


def watch(
    thread: threading.Thread,
    progress: SoakProgress,
    *,
    step_timeout_s: float = STEP_TIMEOUT_S,
    soak_timeout_s: float = SOAK_TIMEOUT_S,
) -> str | None:
    """Wait for the soak, bounded; the reason it hung, or None."""
    started = time.monotonic()
    while thread.is_alive():
        thread.join(WATCHDOG_POLL_S)
        now = time.monotonic()
        if now - progress.last_progress > step_timeout_s:
            return f"step {progress.steps_done} made no progress for {step_timeout_s:g} s"
        if now - started > soak_timeout_s:
            return f"the soak exceeded {soak_timeout_s:g} s at step {progress.steps_done}"
    return None


@pytest.mark.gate
def test_gate_5_soak_mixed_partial_splits(afd_options, afd_results):
    if afd_options.backend != CPU_BACKEND:
        pytest.skip("the soak drives the CPU executor directly (no vLLM-Ascend equivalent here)")
    model = build_model(named_config(SOAK_MODEL, **SOAK_LAYER_OVERRIDES), afd_options.seed)
    num_blocks = (MAX_LIVE_REQUESTS + len(PROBE_LENGTHS)) * BLOCKS_PER_REQUEST
    cache = PagedKVCache(model.config, GATE_BLOCK_SIZE, num_blocks=num_blocks)
    executor = Executor(model, cache)
    probe_blocks = list(range(len(PROBE_LENGTHS) * BLOCKS_PER_REQUEST))
    soak_blocks = range(len(probe_blocks), num_blocks)
    emulations = [parse_topology(s).cpu_emulation() for s in SUPPORTED_CPU_TOPOLOGIES]
    constraints = sorted(
        {SplitConstraints(align=e.split_align, pcp_size=e.pcp_size) for e in emulations},
        key=lambda c: (c.align, c.pcp_size),
    )
    rng = np.random.default_rng(afd_options.seed)
    progress = SoakProgress()
    probe_seed = afd_options.seed + PROBE_SEED_OFFSET
    with checked_splits(CPU_BACKEND) as splits:
        before = run_probe(executor, probe_blocks, probe_seed)
        soak = Soak(executor, rng, constraints, soak_blocks)
        thread = threading.Thread(
            target=soak_worker, args=(soak, SOAK_STEPS, splits, progress), daemon=True
        )
        started = time.perf_counter()
        thread.start()
        hang = watch(thread, progress)
        soak_s = time.perf_counter() - started
        after = None if hang or progress.error else run_probe(executor, probe_blocks, probe_seed)
    records = progress.records
    partial = [r for r in records if r["partial_request_split"]]
    continuation = [r for r in partial if r["boundary_computed"]]
    probe_identical = after is not None and (
        torch.equal(before.last_logits, after.last_logits)
        and torch.equal(before.next_tokens, after.next_tokens)
        and np.array_equal(before.expert_load, after.expert_load)
    )
    record_gate_result(
        afd_results,
        settings=gate_settings(
            parse_topology(SUPPORTED_CPU_TOPOLOGIES[0]),
            page_scale(CPU_BACKEND),
            split_policy=SPLIT_POLICY,
        ),
        topology=afd_options.topology,
        prompts=make_prompts(PROBE_LENGTHS, probe_seed, tag="probe"),
        outputs=None,
        dataset="gate5/random-soak",
        seed=afd_options.seed,
        gate={
            "gate": 5,
            "model": f"{SOAK_MODEL} with {SOAK_LAYER_OVERRIDES}",
            "steps_requested": SOAK_STEPS,
            "steps_done": progress.steps_done,
            "hang": hang,
            "error": None if progress.error is None else repr(progress.error),
            "soak_s": soak_s,
            "max_step_s": max((r["step_s"] for r in records), default=None),
            "policies": {p: sum(r["policy"] == p for r in records) for p in POLICIES},
            "split_steps": sum(r["is_split"] for r in records),
            "partial_request_splits": len(partial),
            "partial_splits_with_computed_tokens": len(continuation),
            "fallbacks": sum(r["fallback"] for r in records),
            "constraints": [c.to_dict() for c in constraints],
            "invariant_checked_forwards": len(splits.plans),
            "invariant_violations": splits.violations,
            "probe_bit_identical": probe_identical,
        },
    )
    assert hang is None, f"soak hang: {hang}"
    if progress.error is not None:
        raise progress.error
    assert progress.steps_done == SOAK_STEPS
    assert len(partial) >= MIN_PARTIAL_SPLIT_FRACTION * SOAK_STEPS, (
        f"only {len(partial)} of {SOAK_STEPS} steps cut inside a request"
    )
    assert len(continuation) >= MIN_CONTINUATION_SPLITS, (
        f"only {len(continuation)} partial splits had non-zero computed tokens"
    )
    assert probe_identical, "the probe batch's outputs changed across the soak"


@pytest.mark.gate
def test_gate_5_watchdog_reports_a_stalled_step():
    """The soak's hang detector fires on a worker that stops making progress."""
    stall_s = 0.2
    release = threading.Event()
    progress = SoakProgress(steps_done=7)
    thread = threading.Thread(target=release.wait, daemon=True)
    thread.start()
    try:
        hang = watch(thread, progress, step_timeout_s=stall_s)
    finally:
        release.set()
    assert hang is not None and "step 7 made no progress" in hang


@pytest.mark.gate
def test_gate_5_leak_detector_sees_state_left_behind(afd_options):
    """An attribute a forward leaves on the executor or a layer differs from a fresh executor."""
    model = build_model(named_config(SOAK_MODEL, **SOAK_LAYER_OVERRIDES), afd_options.seed)
    executor = Executor(model, PagedKVCache(model.config, GATE_BLOCK_SIZE))
    fresh = executor_state(Executor(model, executor.kv_cache))
    assert first_difference(executor_state(executor), fresh) == ""
    executor.last_plan = "ubatch 1"
    assert "executor" in first_difference(executor_state(executor), fresh)
    del executor.last_plan
    model.layers[-1].stage_metadata = "tail"
    try:
        assert "layers" in first_difference(executor_state(executor), fresh)
    finally:
        del model.layers[-1].stage_metadata
