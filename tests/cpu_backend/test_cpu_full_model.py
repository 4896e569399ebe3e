"""Full 61-layer model checks (slow: select with -m slow)."""

import pytest
import torch

from pytest_afd.backends.cpu import FULL, build_model
from tests.support.cpu_runner import Runner, make_prompts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def full_model():
    return build_model(FULL, seed=0)


def test_full_model_matches_transformers(full_model):
    transformers = pytest.importorskip("transformers")
    hf = {k: v for k, v in FULL.to_hf_dict().items() if k != "model_type"}
    reference = transformers.DeepseekV32ForCausalLM(transformers.DeepseekV32Config(**hf)).eval()
    reference.load_state_dict(full_model.weights, strict=True)
    prompt = make_prompts([256], seed=7)[0]
    mine, _ = Runner(full_model).whole([prompt])
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(mine.last_logits[0], expected)


@pytest.mark.parametrize("quantization", ["none", "w8a8"])
def test_full_model_long_sparse_split_is_bitwise_equal(full_model, quantization):
    """index_topk=2048 < 3000-token context: sparse attention, cut inside the long request."""
    model = full_model.variant(quantization=quantization, routing="natural")
    prompts = make_prompts([3000, 500], seed=8)
    whole, _ = Runner(model, 128).whole(prompts)
    split, plan = Runner(model, 128).whole(prompts, "token_balanced")
    assert plan.boundary_request == 0
    assert torch.equal(split.last_logits, whole.last_logits)
