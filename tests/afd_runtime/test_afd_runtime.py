"""The 1 Attention + 1 FFN process runtime against the in-process executor."""

import itertools

import numpy as np
import pytest

from afd_split import SplitConstraints
from pytest_afd.backends.cpu.afd.evidence import ATTENTION, ROUTED_MOE, WAIT
from pytest_afd.backends.cpu.afd.step_evidence import ONE_FFN_RANK
from tests.support.afd_runtime_helpers import make_batch, plan_for, reference_forward

LENGTHS = [90, 12, 20, 14]  # one long request: token_balanced cuts inside it
POLICIES = ["none", "request_boundary", "token_balanced", "cost_balanced"]


def _moe_layers(config):
    return list(config.moe_layer_indices)


@pytest.mark.parametrize("policy", POLICIES)
def test_staged_forward_is_bit_identical_to_executor(runtime_1p1, reference_model, afd_config, policy):
    ids, metadata = make_batch(afd_config, LENGTHS, seed=1)
    plan = plan_for(metadata, policy)
    runtime_1p1.reset_kv_cache()
    result = runtime_1p1.run_forward(ids, metadata, plan, stage_dense_layers=True)
    (expected,) = reference_forward(reference_model, [(ids, metadata)], [plan])
    np.testing.assert_array_equal(result.logits, expected.last_logits.numpy())
    np.testing.assert_array_equal(np.asarray(result.expert_load), expected.expert_load)
    if policy == "token_balanced":
        assert plan.boundary_request == 0, "the test must exercise a cut inside a request"


@pytest.mark.parametrize("policy", ["none", "request_boundary", "token_balanced"])
def test_cam_data_flow_matches_executor(runtime_1p1, reference_model, afd_config, policy):
    """Dense layers on the whole batch (the recipe's flow): exact unless a request is cut."""
    ids, metadata = make_batch(afd_config, LENGTHS, seed=2)
    plan = plan_for(metadata, policy)
    runtime_1p1.reset_kv_cache()
    result = runtime_1p1.run_forward(ids, metadata, plan)
    (expected,) = reference_forward(reference_model, [(ids, metadata)], [plan])
    reference = expected.last_logits.numpy()
    if plan.boundary_request is None:
        np.testing.assert_array_equal(result.logits, reference)
    else:
        # The cut request's dense-layer attention runs as one piece instead of two.
        np.testing.assert_allclose(result.logits, reference, rtol=1e-5, atol=1e-5)
    assert result.logits.argmax(-1).tolist() == expected.next_tokens.tolist()
    np.testing.assert_array_equal(np.asarray(result.expert_load), expected.expert_load)


def test_chunked_continuation_with_padding_reads_earlier_kv(runtime_1p1, reference_model, afd_config):
    """Step 2 continues step 1's requests: the Attention rank's KV cache persists across steps."""
    first_ids, first = make_batch(afd_config, [40, 30], computed=[0, 0], seed=3)
    second_ids, second = make_batch(afd_config, [25, 50], computed=[40, 30], seed=4)
    # Reuse step 1's block table so both steps address the same blocks.
    from afd_split.checks.metadata import BatchMetadata

    table = np.zeros((2, 6), dtype=np.int64)
    table[0, :5], table[1, :5] = np.arange(0, 5), np.arange(5, 10)
    first = BatchMetadata.from_requests([40, 30], [0, 0], table, first.block_size)
    second = BatchMetadata.from_requests([25, 50], [40, 30], table, second.block_size)
    constraints = SplitConstraints(align=4, padded_total=84)
    plans = [plan_for(first, "token_balanced"), plan_for(second, "token_balanced", constraints=constraints)]
    assert plans[1].ubatches[-1].num_padded_tokens > 0
    runtime_1p1.reset_kv_cache()
    results = [
        runtime_1p1.run_forward(ids, meta, plan, stage_dense_layers=True)
        for (ids, meta), plan in zip([(first_ids, first), (second_ids, second)], plans, strict=True)
    ]
    expected = reference_forward(reference_model, [(first_ids, first), (second_ids, second)], plans)
    for got, want in zip(results, expected, strict=True):
        np.testing.assert_array_equal(got.logits, want.last_logits.numpy())
        assert got.padding_routed_rows == want.padding_routed_rows


def test_copied_prefix_block_is_read_by_the_next_step(runtime_1p1, reference_model, afd_config):
    """copy_kv_slots lets a parent-side BlockPool reuse a partial prefix block on the rank."""
    import torch

    from afd_split.checks.metadata import BatchMetadata
    from pytest_afd.backends.cpu import Executor, PagedKVCache
    from tests.support.afd_runtime_helpers import BLOCK_SIZE, THREADS_PER_RANK

    seed_ids, _ = make_batch(afd_config, [40], seed=12)
    seeded = BatchMetadata.from_requests([40], [0], np.array([[0, 1, 2]]), BLOCK_SIZE)
    # The new request shares 20 prefix tokens: block 0 whole, 4 slots of block 1 copied to block 5.
    src = np.arange(BLOCK_SIZE, BLOCK_SIZE + 4)
    dst = np.arange(5 * BLOCK_SIZE, 5 * BLOCK_SIZE + 4)
    new_ids, _ = make_batch(afd_config, [30], seed=13)
    cont = BatchMetadata.from_requests([30], [20], np.array([[0, 5, 6, 7]]), BLOCK_SIZE)
    plan_seed, plan_cont = plan_for(seeded, "none"), plan_for(cont, "none")
    runtime_1p1.reset_kv_cache()
    runtime_1p1.run_forward(seed_ids, seeded, plan_seed, stage_dense_layers=True)
    runtime_1p1.copy_kv_slots(src, dst, block_size=BLOCK_SIZE)
    got = runtime_1p1.run_forward(new_ids, cont, plan_cont, stage_dense_layers=True)
    torch.set_num_threads(THREADS_PER_RANK)
    cache = PagedKVCache(afd_config, BLOCK_SIZE, num_blocks=8)
    executor = Executor(reference_model, cache)
    executor.execute(seed_ids, seeded, plan_seed)
    cache.copy_slots(torch.from_numpy(src), torch.from_numpy(dst))
    want = executor.execute(new_ids, cont, plan_cont)
    np.testing.assert_array_equal(got.logits, want.last_logits.numpy())
    with pytest.raises(ValueError, match="src has shape"):
        runtime_1p1.copy_kv_slots(src, dst[:2], block_size=BLOCK_SIZE)


def test_instrumented_step_evidence(runtime_1p1, afd_config):
    ids, metadata = make_batch(afd_config, LENGTHS, seed=5)
    plan = plan_for(metadata, "token_balanced")
    result = runtime_1p1.run_forward(ids, metadata, plan, instrument=True)
    evidence = result.evidence
    moe_layers = _moe_layers(afd_config)
    assert evidence["instrumented"] is True
    assert evidence["plans"][0]["split_token"] == plan.split_token
    assert evidence["ffn_rows_served"] == {"FFN rank 0": sum(u.num_rows for u in plan.ubatches) * len(moe_layers)}
    for role in ("attention", "ffn"):
        keys = {(row["layer"], row["ubatch"]) for row in evidence["per_layer"][role]}
        assert {(layer, u) for layer in moe_layers for u in (0, 1)} <= keys
    step = evidence["step_time_s"]
    assert 0 <= evidence["exposed_bubble_s"] < step
    assert 0 <= evidence["overlap_fraction"] <= 1
    assert 0 < evidence["critical_path_s"] <= step * 1.01
    # One FFN rank has nobody to straggle against: absent with that reason, never 0.
    assert evidence["straggler_s"] == {"value": None, "absent_reason": ONE_FFN_RANK}
    # Thread-CPU seconds never exceed the wall time of the same spans (beyond clock granularity).
    wall, cpu = evidence["totals_s"]["attention"], evidence["totals_cpu_s"]["attention"]
    assert 0 < cpu["attention"] <= wall["attention"] * 1.05 + 1e-3
    assert {row["layer"] for row in evidence["per_layer_cpu"]["ffn"]} == set(moe_layers)
    assert set(evidence["cpu_time_s"]) == {"Attention rank 0", "FFN rank 0"}
    load = evidence["load"]["per_layer"]
    assert len(load) == len(moe_layers)
    for layer_load, counts in zip(load, result.expert_load, strict=True):
        assert layer_load["expert"]["max"] == max(counts)
        assert layer_load["expert"]["mean"] == pytest.approx(np.mean(counts))
        assert layer_load["ffn_rank_tokens"] == [sum(counts)]


def test_attention_rank_runs_the_two_stage_schedule(runtime_1p1, afd_config):
    """Ubatch 1's attention is issued before ubatch 0's expert result is awaited, every layer."""
    ids, metadata = make_batch(afd_config, [64, 64], seed=6)
    plan = plan_for(metadata, "token_balanced")
    spans = runtime_1p1.run_forward(ids, metadata, plan, instrument=True).spans
    order = [(s.kind, s.layer, s.ubatch) for s in spans[0] if s.kind in (ATTENTION, WAIT)]
    moe = _moe_layers(afd_config)
    expected = [(ATTENTION, moe[0], 0), (ATTENTION, moe[0], 1)]
    for previous, layer in itertools.pairwise(moe):
        for u in (0, 1):
            expected += [(WAIT, previous, u), (ATTENTION, layer, u)]
    expected += [(WAIT, moe[-1], 0), (WAIT, moe[-1], 1)]
    assert order[-len(expected):] == expected
    # The FFN rank served the ubatches in the order they were dispatched.
    served = [(s.layer, s.ubatch) for s in spans[1] if s.kind == ROUTED_MOE]
    assert served == [(layer, u) for layer in moe for u in (0, 1)]


def test_headline_run_records_no_timings(runtime_1p1, afd_config):
    ids, metadata = make_batch(afd_config, LENGTHS, seed=7)
    result = runtime_1p1.run_forward(ids, metadata, plan_for(metadata, "token_balanced"))
    assert result.evidence["instrumented"] is False
    assert "per_layer" not in result.evidence and "exposed_bubble_s" not in result.evidence
    assert result.evidence["step_time_s"] > 0


def test_bad_batches_are_rejected_before_the_ranks_see_them(runtime_1p1, afd_config):
    ids, metadata = make_batch(afd_config, [10, 6], seed=8)
    other_ids, other = make_batch(afd_config, [8, 8], seed=8)
    with pytest.raises(ValueError, match=r"plan's per-request tokens \(8, 8\)"):
        runtime_1p1.run_forward(ids, metadata, plan_for(other, "token_balanced"))
    with pytest.raises(ValueError, match="input_ids has 15 tokens"):
        runtime_1p1.run_forward(ids[:15], metadata, plan_for(metadata, "none"))
    with pytest.raises(ValueError, match="fault mode 'explode'"):
        runtime_1p1.run_forward(ids, metadata, plan_for(metadata, "none"),
                                fault={"mode": "explode", "ffn_rank": 0, "layer": 2})
    with pytest.raises(ValueError, match="got 2 batches for 1 Attention rank"):
        runtime_1p1.run_dp_forward([(ids, metadata, plan_for(metadata, "none"), None)] * 2)
    # The runtime is still healthy.
    result = runtime_1p1.run_forward(other_ids, other, plan_for(other, "none"))
    assert result.logits.shape == (2, afd_config.vocab_size)


def _prefix_cached_steps(executor, pool, config):
    """Prompt A, then prompt B sharing A's first 3 blocks; B reuses 40 tokens (2.5 blocks).

    The half block is BlockPool's partial reuse: copied into a fresh block first.
    """
    from afd_split.checks.metadata import BatchMetadata
    from tests.support.afd_runtime_helpers import BLOCK_SIZE

    rng = np.random.default_rng(40)
    prompt_a = rng.integers(0, config.vocab_size, 64).tolist()
    prompt_b = prompt_a[:48] + rng.integers(0, config.vocab_size, 22).tolist()
    outputs = []
    for prompt, cached in ((prompt_a, 0), (prompt_b, 40)):
        blocks = pool.allocate(prompt, cached)
        scheduled = len(prompt) - cached
        table = np.array([blocks.block_ids])
        metadata = BatchMetadata.from_requests([scheduled], [cached], table, BLOCK_SIZE)
        plan = plan_for(metadata, "token_balanced")
        outputs.append(executor.execute(np.array(prompt[cached:]), metadata, plan))
        pool.finish(prompt, blocks, keep_prefix=True)
    return outputs


def test_afd_executor_and_rank_cache_drive_prefix_caching_like_the_executor(
    runtime_1p1, reference_model, afd_config
):
    import torch

    from pytest_afd.backends.cpu import BlockPool, Executor, PagedKVCache
    from pytest_afd.backends.cpu.afd.adapter import AfdExecutor, RankKVCache
    from tests.support.afd_runtime_helpers import BLOCK_SIZE, THREADS_PER_RANK

    runtime_1p1.reset_kv_cache()
    afd = AfdExecutor(runtime_1p1, instrument=True)
    got = _prefix_cached_steps(afd, BlockPool(RankKVCache(runtime_1p1, afd_config, BLOCK_SIZE)), afd_config)
    torch.set_num_threads(THREADS_PER_RANK)
    cache = PagedKVCache(afd_config, BLOCK_SIZE)
    want = _prefix_cached_steps(Executor(reference_model, cache), BlockPool(cache), afd_config)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.last_logits, w.last_logits, rtol=0, atol=0)
        assert g.next_tokens.tolist() == w.next_tokens.tolist()
        np.testing.assert_array_equal(g.expert_load, w.expert_load)
        assert g.ubatch_rows == w.ubatch_rows
    assert afd.last_evidence["instrumented"] and afd.last_evidence["plans"][0]["split_token"] == 15
