"""V3.2 lightning indexer: deterministic top-k ties, dense reduction, split-invariant selection."""

import torch

from pytest_afd.backends.cpu import build_model, named_config, select_topk
from tests.support.cpu_runner import Runner, make_prompts


def test_ties_prefer_higher_score_then_lower_position():
    scores = torch.tensor([[1.0, 0.0, 0.0, 0.0, 2.0, 0.0]])
    assert select_topk(scores, 3).nonzero()[:, 1].tolist() == [0, 1, 4]
    masked = torch.tensor([[0.0, float("-inf"), 0.0, 5.0, 0.0]])
    assert select_topk(masked, 2).nonzero()[:, 1].tolist() == [0, 3]


def test_selection_of_a_row_does_not_depend_on_the_batch():
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 3, (64, 300), generator=generator).float()  # many exact ties
    together = select_topk(scores, 40)
    alone = torch.cat([select_topk(scores[i : i + 1], 40) for i in range(64)])
    assert torch.equal(together, alone)
    assert (together.sum(-1) == 40).all()


def test_without_ties_matches_topk_set():
    scores = torch.randn(8, 100, generator=torch.Generator().manual_seed(1))
    mine = select_topk(scores, 10)
    ref = torch.zeros_like(mine).scatter_(1, scores.topk(10).indices, True)
    assert torch.equal(mine, ref)


def test_context_within_topk_reduces_to_dense():
    prompts = make_prompts([120, 64])
    at_context = Runner(build_model(named_config("reduced", index_topk=120), 0)).whole(prompts)[0]
    huge = Runner(build_model(named_config("reduced", index_topk=1 << 20), 0)).whole(prompts)[0]
    sparse = Runner(build_model(named_config("reduced", index_topk=32), 0)).whole(prompts)[0]
    assert torch.equal(at_context.last_logits, huge.last_logits)
    assert not torch.allclose(sparse.last_logits, huge.last_logits, atol=1e-3)


def test_sparse_split_matches_unsplit(sparse_model):
    prompts = make_prompts([70, 230, 41], seed=3)
    unsplit = Runner(sparse_model).whole(prompts)[0]
    split, plan = Runner(sparse_model).whole(prompts, "token_balanced")
    assert plan.boundary_request == 1
    assert torch.equal(split.last_logits, unsplit.last_logits)  # bitwise, see docs/cpu-backend.md

