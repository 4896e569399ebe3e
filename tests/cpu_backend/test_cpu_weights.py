"""Seeded weights are deterministic; HF-style safetensors load (packed and per-expert layouts)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from pytest_afd.backends.cpu import (
    FULL,
    REDUCED,
    DeepseekV32Model,
    init_weights,
    load_pretrained,
    save_pretrained,
)
from pytest_afd.backends.cpu.weights import weights_digest


def test_same_seed_same_bits_other_seed_differs():
    a, b, c = init_weights(REDUCED, 7), init_weights(REDUCED, 7), init_weights(REDUCED, 8)
    assert weights_digest(a) == weights_digest(b)
    assert weights_digest(a) != weights_digest(c)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_reduced_layers_are_first_layers_of_full():
    reduced, full = init_weights(REDUCED, 3), init_weights(FULL, 3)
    assert set(reduced) <= set(full)
    assert all(torch.equal(reduced[k], full[k]) for k in reduced)


def test_negative_seed_rejected():
    with pytest.raises(ValueError, match="seed=-1"):
        init_weights(REDUCED, -1)


def test_save_load_round_trip(tmp_path):
    weights = init_weights(REDUCED, 1)
    save_pretrained(REDUCED, weights, tmp_path)
    config, loaded = load_pretrained(tmp_path, name="reduced")
    assert config == REDUCED
    assert weights_digest(loaded) == weights_digest(weights)


def test_per_expert_checkpoint_layout_is_packed(tmp_path):
    weights = init_weights(REDUCED, 1)
    per_expert = {}
    inter = REDUCED.moe_intermediate_size
    for name, tensor in weights.items():
        if name.endswith("experts.gate_up_proj"):
            prefix = name.removesuffix(".gate_up_proj")
            for e in range(tensor.shape[0]):
                per_expert[f"{prefix}.{e}.gate_proj.weight"] = tensor[e, :inter].clone()
                per_expert[f"{prefix}.{e}.up_proj.weight"] = tensor[e, inter:].clone()
        elif name.endswith("experts.down_proj"):
            prefix = name.removesuffix(".down_proj")
            for e in range(tensor.shape[0]):
                per_expert[f"{prefix}.{e}.down_proj.weight"] = tensor[e].clone()
        else:
            per_expert[name] = tensor
    (tmp_path / "config.json").write_text(json.dumps(REDUCED.to_hf_dict()))
    save_file(per_expert, str(tmp_path / "model.safetensors"))
    _, loaded = load_pretrained(tmp_path)
    assert weights_digest(loaded) == weights_digest(weights)


def test_missing_or_misshapen_weight_named(tmp_path):
    weights = init_weights(REDUCED, 1)
    name = "model.layers.4.self_attn.kv_b_proj.weight"
    broken = {k: v for k, v in weights.items() if k != name}
    with pytest.raises(ValueError, match=name):
        DeepseekV32Model(REDUCED, broken)
    broken[name] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"shape \(3, 3\)"):
        DeepseekV32Model(REDUCED, broken)


def test_no_safetensors_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(REDUCED.to_hf_dict()))
    with pytest.raises(ValueError, match=r"no \*\.safetensors"):
        load_pretrained(tmp_path)
