"""Independent check: our executor vs transformers' DeepSeek V3 / V3.2 on the same config + weights.

Exactness uses ``index_topk >= context`` (the indexer then reduces to dense
attention). With ``index_topk < context`` transformers' V3.2 picks different
keys for a prompt fed whole vs in two chunks (``torch.topk`` breaks the
indexer's frequent exact ties shape-dependently); the last test measures that
and checks our executor's tie-breaking keeps selections identical.
"""

import numpy as np
import pytest
import torch

from pytest_afd.backends.cpu import build_model, named_config
from tests.support.cpu_runner import Runner, make_prompts

transformers = pytest.importorskip("transformers")

PARITY_CONFIG = named_config("reduced", num_hidden_layers=5, first_k_dense_replace=2)
SPARSE_TOPK = 48


def hf_kwargs(config):
    return {k: v for k, v in config.to_hf_dict().items() if k != "model_type"}


@pytest.fixture(scope="module")
def ours():
    return build_model(PARITY_CONFIG, seed=11)


@pytest.fixture(scope="module")
def hf_v32(ours):
    model = transformers.DeepseekV32ForCausalLM(
        transformers.DeepseekV32Config(**hf_kwargs(PARITY_CONFIG))
    ).eval()
    model.load_state_dict(ours.weights, strict=True)
    return model


def hf_last_logits(model, prompt):
    with torch.no_grad():
        out = model(torch.tensor([prompt]), output_hidden_states=True)
    return out.logits[0, -1], out.hidden_states


def test_transformers_config_accepts_our_fields():
    hf = PARITY_CONFIG.to_hf_dict()
    cfg = transformers.DeepseekV32Config(**{k: v for k, v in hf.items() if k != "model_type"})
    assert cfg.qk_head_dim == PARITY_CONFIG.qk_head_dim
    assert cfg.mlp_layer_types.count("sparse") == len(PARITY_CONFIG.moe_layer_indices)


def test_v32_single_prompt_logits_and_layers_match(ours, hf_v32):
    prompt = make_prompts([300], seed=1)[0]
    mine, _ = Runner(ours).whole([prompt], return_hidden_states=True)
    ref_logits, ref_hidden = hf_last_logits(hf_v32, prompt)
    torch.testing.assert_close(mine.last_logits[0], ref_logits)
    # hidden_states[i + 1] is layer i's output (the last one is after the final norm).
    for layer, hidden in enumerate(mine.layer_hidden[:-1]):
        torch.testing.assert_close(hidden, ref_hidden[layer + 1][0], msg=f"layer {layer}")


def test_v32_split_and_chunked_batch_matches(ours, hf_v32):
    prompts = make_prompts([90, 210], seed=2)
    runner = Runner(ours)
    blocks = runner.allocate(prompts)
    runner.forward(prompts, blocks, [(1, 0, 80)])
    out, plan = runner.forward(prompts, blocks, [(0, 0, 90), (1, 80, 130)], "token_balanced")
    assert plan.boundary_request == 1
    for index, prompt in enumerate(prompts):
        torch.testing.assert_close(out.last_logits[index], hf_last_logits(hf_v32, prompt)[0])


def test_v3_dense_attention_matches(ours):
    """DeepseekV3ForCausalLM has no indexer: equal to ours while index_topk >= context."""
    model = transformers.DeepseekV3ForCausalLM(
        transformers.DeepseekV3Config(**hf_kwargs(PARITY_CONFIG), num_mtp_layers=0)
    ).eval()
    result = model.load_state_dict(ours.weights, strict=False)
    assert result.missing_keys == []
    assert all(".indexer." in key for key in result.unexpected_keys)
    prompt = make_prompts([256], seed=3)[0]
    mine, _ = Runner(ours).whole([prompt])
    torch.testing.assert_close(mine.last_logits[0], hf_last_logits(model, prompt)[0])


def _our_selections(model, monkeypatch, run):
    """{(layer, query position): selected key positions} recorded from the sparse mask."""
    from pytest_afd.backends.cpu.model import DecoderLayer

    seen = {}
    original = DecoderLayer._sparse_mask

    def recording(self, index_query, index_weights, index_key, causal):
        mask = original(self, index_query, index_weights, index_key, causal)
        positions = causal.sum(-1) - 1
        for row, pos in enumerate(positions.tolist()):
            if pos < SPARSE_TOPK:  # dense rows: every causal key
                continue
            seen[(self.index, pos)] = frozenset(mask[row].nonzero().flatten().tolist())
        return mask

    monkeypatch.setattr(DecoderLayer, "_sparse_mask", recording)
    out = run()
    monkeypatch.setattr(DecoderLayer, "_sparse_mask", original)
    return seen, out


def test_sparse_selection_whole_vs_chunked_report(monkeypatch, record_property):
    config = PARITY_CONFIG.replace(index_topk=SPARSE_TOPK)
    model = build_model(config, seed=11)
    prompt = make_prompts([200], seed=4)[0]
    cut = 120

    def whole():
        return Runner(model).whole([prompt])[0]

    def chunked_split():
        runner = Runner(model)
        blocks = runner.allocate([prompt])
        runner.forward([prompt], blocks, [(0, 0, cut)], "token_balanced")
        return runner.forward([prompt], blocks, [(0, cut, 200 - cut)], "token_balanced")[0]

    whole_sel, whole_out = _our_selections(model, monkeypatch, whole)
    chunk_sel, chunk_out = _our_selections(model, monkeypatch, chunked_split)
    assert len(whole_sel) == config.num_hidden_layers * (200 - SPARSE_TOPK)
    ours_changed = sum(whole_sel[key] != chunk_sel[key] for key in whole_sel)
    ours_diff = float((whole_out.last_logits - chunk_out.last_logits).abs().max())

    hf = transformers.DeepseekV32ForCausalLM(
        transformers.DeepseekV32Config(**hf_kwargs(config))
    ).eval()
    hf.load_state_dict(model.weights, strict=True)
    captured = []
    for layer in hf.model.layers:
        layer.self_attn.indexer.register_forward_hook(lambda m, i, o: captured.append(o[0]))
    ids = torch.tensor([prompt])
    with torch.no_grad():
        hf_whole = hf(ids).logits[0, -1]
        head = hf(ids[:, :cut], use_cache=True)
        hf_chunked = hf(ids[:, cut:], cache=head.cache, use_cache=True).logits[0, -1]
    layers = config.num_hidden_layers
    whole_idx, tail_idx = captured[:layers], captured[2 * layers:]
    hf_changed = sum(
        set(whole_idx[layer][cut + row].tolist()) != set(tail_idx[layer][row].tolist())
        for layer in range(layers)
        for row in range(200 - cut)
    )
    hf_diff = float((hf_whole - hf_chunked).abs().max())
    report = {
        "ours_rows_compared": len(whole_sel),
        "transformers_rows_compared": layers * (200 - cut),
        "ours_changed_rows": ours_changed,
        "ours_logit_max_abs_diff": ours_diff,
        "transformers_changed_rows": hf_changed,
        "transformers_logit_max_abs_diff": hf_diff,
        "ours_vs_transformers_logit_max_abs_diff": float(
            (whole_out.last_logits[0] - hf_whole).abs().max()
        ),
    }
    record_property("sparse_selection_report", report)
    print("sparse selection report:", report)
    assert ours_changed == 0
    torch.testing.assert_close(chunk_out.last_logits, whole_out.last_logits)
    assert np.isfinite(hf_diff)
