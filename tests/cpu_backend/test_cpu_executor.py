"""Executor: unsplit, token-split (incl. inside a prefix-hit request), chunked, prefix-cached."""

import numpy as np
import pytest
import torch

from afd_split import SplitConstraints
from tests.support.cpu_runner import SMALL_BLOCK, Runner, make_prompts

LENGTHS = [150, 37, 260]


def assert_logits_close(a, b):
    torch.testing.assert_close(a.last_logits, b.last_logits)  # float32 defaults


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(LENGTHS)


@pytest.fixture(scope="module")
def unsplit(reduced_model, prompts):
    out, _ = Runner(reduced_model).whole(prompts, return_hidden_states=True)
    return out


@pytest.mark.parametrize(
    ("policy", "constraints"),
    [
        ("token_balanced", SplitConstraints()),
        ("request_boundary", SplitConstraints()),
        ("token_balanced", SplitConstraints(align=8)),
        ("token_balanced", SplitConstraints(pcp_size=2)),
        ("token_balanced", SplitConstraints(align=4, padded_total=480)),
    ],
)
def test_split_matches_unsplit(reduced_model, prompts, unsplit, policy, constraints):
    out, plan = Runner(reduced_model).whole(prompts, policy, constraints)
    assert plan.is_split
    assert_logits_close(out, unsplit)
    assert torch.equal(out.next_tokens, unsplit.next_tokens)
    np.testing.assert_array_equal(out.expert_load, unsplit.expert_load)
    padding = sum(u.num_padded_tokens for u in plan.ubatches)
    assert out.ubatch_rows == [u.num_rows for u in plan.ubatches]
    assert out.padding_routed_rows == padding * len(reduced_model.config.moe_layer_indices)


def test_token_split_cuts_inside_a_request(reduced_model, prompts, unsplit):
    out, plan = Runner(reduced_model).whole(prompts, "token_balanced")
    assert plan.boundary_request is not None and plan.head_tokens > 0 and plan.tail_tokens > 0
    for mine, ref in zip(out.layer_hidden or [], unsplit.layer_hidden, strict=False):
        torch.testing.assert_close(mine, ref)


def test_split_inside_prefix_hit_request(reduced_model, prompts, unsplit):
    """Request 2 has 128 cached tokens (written by an earlier forward); the cut falls inside it."""
    runner = Runner(reduced_model)
    blocks = runner.allocate(prompts)
    runner.forward(prompts, blocks, [(2, 0, 128)])
    pieces = [(1, 0, 37), (2, 128, 132)]
    out, plan = runner.forward(prompts, blocks, pieces, "token_balanced")
    assert plan.boundary_request == 1 and plan.head_tokens > 0 and plan.tail_tokens > 0
    torch.testing.assert_close(out.last_logits, unsplit.last_logits[1:])


def test_chunked_matches_whole(reduced_model, prompts, unsplit):
    runner = Runner(reduced_model)
    blocks = runner.allocate(prompts)
    runner.forward(prompts, blocks, [(0, 0, 64), (2, 0, 96)])
    runner.forward(prompts, blocks, [(0, 64, 64), (2, 96, 100)], "token_balanced")
    out, _ = runner.forward(prompts, blocks, [(0, 128, 22), (1, 0, 37), (2, 196, 64)],
                            "token_balanced")
    assert_logits_close(out, unsplit)


def test_prefix_cached_blocks_are_reused(reduced_model, prompts, unsplit):
    runner = Runner(reduced_model)
    first = runner.allocate([prompts[2]])
    runner.forward([prompts[2]], first, [(0, 0, 260)])
    runner.pool.finish(prompts[2], first[0], keep_prefix=True)
    assert runner.pool.num_cached_blocks == 260 // SMALL_BLOCK
    hit = 256 - SMALL_BLOCK * 2
    blocks = runner.allocate(prompts, cached=[0, 0, hit])
    assert blocks[2].block_ids[: hit // SMALL_BLOCK] == first[0].block_ids[: hit // SMALL_BLOCK]
    pieces = [(0, 0, 150), (1, 0, 37), (2, hit, 260 - hit)]
    out, _ = runner.forward(prompts, blocks, pieces, "token_balanced")
    assert_logits_close(out, unsplit)


def test_partial_block_hit_is_copied_not_shared(reduced_model, prompts, unsplit):
    runner = Runner(reduced_model)
    first = runner.allocate([prompts[2]])
    runner.forward([prompts[2]], first, [(0, 0, 260)])
    runner.pool.finish(prompts[2], first[0], keep_prefix=True)
    blocks = runner.allocate([prompts[2]], cached=[100])
    assert blocks[0].block_ids[6] != first[0].block_ids[6]
    out, _ = runner.forward([prompts[2]], blocks, [(0, 100, 160)])
    torch.testing.assert_close(out.last_logits[0], unsplit.last_logits[2])


def test_padding_rows_never_reach_the_kv_cache(reduced_model, prompts):
    runner = Runner(reduced_model)
    sentinel = 12345.0
    runner.cache.ensure_blocks(64)
    for layer in range(reduced_model.config.num_hidden_layers):
        runner.cache.storage(layer).fill_(sentinel)
    blocks = runner.allocate(prompts)
    _, plan = runner.forward(prompts, blocks, [(i, 0, n) for i, n in enumerate(LENGTHS)],
                             "token_balanced", SplitConstraints(align=16, pcp_size=2))
    assert sum(u.num_padded_tokens for u in plan.ubatches) > 0
    written = set()
    for b, n in zip(blocks, LENGTHS, strict=True):
        written.update(b.block_ids[p // SMALL_BLOCK] * SMALL_BLOCK + p % SMALL_BLOCK for p in range(n))
    for layer in range(reduced_model.config.num_hidden_layers):
        changed = (runner.cache.storage(layer) != sentinel).any(-1).nonzero().flatten().tolist()
        assert set(changed) == written


def test_same_seed_same_bits(prompts):
    from pytest_afd.backends.cpu import build_model, named_config

    outs = [Runner(build_model(named_config("reduced"), seed=5)).whole(prompts, "token_balanced")[0]
            for _ in range(2)]
    assert torch.equal(outs[0].last_logits, outs[1].last_logits)
    other = Runner(build_model(named_config("reduced"), seed=6)).whole(prompts)[0]
    assert not torch.equal(outs[0].last_logits, other.last_logits)


def test_expert_load_counts_every_routed_real_token(reduced_model, prompts, unsplit):
    top_k = reduced_model.config.num_experts_per_tok
    assert unsplit.expert_load.shape == (7, reduced_model.config.n_routed_experts)
    assert (unsplit.expert_load.sum(1) == sum(LENGTHS) * top_k).all()


def test_forced_balanced_routing_is_balanced_and_changes_outputs(reduced_model, prompts, unsplit):
    forced = reduced_model.variant(quantization="none", routing="forced_balanced")
    out, _ = Runner(forced).whole(prompts)
    split, _ = Runner(forced).whole(prompts, "token_balanced")
    assert (out.expert_load.max(1) - out.expert_load.min(1) <= len(LENGTHS)).all()
    assert (unsplit.expert_load.max(1) - unsplit.expert_load.min(1) > len(LENGTHS)).any()
    assert not torch.allclose(out.last_logits, unsplit.last_logits)
    assert_logits_close(split, out)


def test_input_mismatch_errors(reduced_model, prompts):
    runner = Runner(reduced_model)
    blocks = runner.allocate(prompts[:1])
    from afd_split.checks.metadata import BatchMetadata

    md = BatchMetadata.from_requests([150], None, np.array([blocks[0].block_ids]), SMALL_BLOCK)
    with pytest.raises(ValueError, match="149"):
        runner.executor.execute(np.zeros(149, dtype=np.int64), md)
    with pytest.raises(ValueError, match="token id 4096"):
        runner.executor.execute(np.full(150, 4096), md)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def intra_op_threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("quantization", ["none", "w8a8"])
def test_split_chunked_cached_runs_are_bitwise_equal(reduced_model, prompts, quantization,
                                                     intra_op_threads):
    """Kernels are called with row counts / key lengths whose per-row rounding does not
    depend on the batch (MIN_KERNEL_ROWS, KEY_BLOCK), so every way of cutting the work
    gives the same bits; W8A8 then makes the same rounding decisions too."""
    model = reduced_model.variant(quantization=quantization, routing="natural")
    whole, _ = Runner(model).whole(prompts)
    split, _ = Runner(model).whole(prompts, "token_balanced", SplitConstraints(align=8))
    runner = Runner(model)
    blocks = runner.allocate(prompts)
    runner.forward(prompts, blocks, [(2, 0, 3), (0, 0, 64)])
    runner.forward(prompts, blocks, [(2, 3, 125), (0, 64, 1)], "token_balanced")
    chunked, _ = runner.forward(prompts, blocks, [(0, 65, 85), (1, 0, 37), (2, 128, 132)],
                                "token_balanced")
    why = "CPU kernels not batch-invariant here; see docs/cpu-backend.md 'Batch invariance'"
    assert torch.equal(split.last_logits, whole.last_logits), why
    assert torch.equal(chunked.last_logits, whole.last_logits), why
