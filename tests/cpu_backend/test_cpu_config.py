"""Model configs: named shapes, validation errors that name the bad value, HF round trip."""

import json

import pytest

from pytest_afd.backends.cpu import (
    FULL,
    REDUCED,
    ModelConfig,
    PagedKVCache,
    config_from_hf_dict,
    load_hf_config,
    named_config,
)


def test_named_configs_have_recipe_layer_counts():
    assert REDUCED.num_hidden_layers == 10
    assert REDUCED.first_k_dense_replace == 3
    assert len(REDUCED.moe_layer_indices) == 7
    assert FULL.num_hidden_layers == 61
    assert FULL.moe_layer_indices == tuple(range(3, 61))
    assert named_config("full") is FULL
    assert named_config("reduced", index_topk=64).index_topk == 64


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"num_experts_per_tok": 40}, "num_experts_per_tok=40"),
        ({"kv_lora_rank": 0}, "kv_lora_rank=0"),
        ({"q_lora_rank": -1}, "q_lora_rank=-1"),
        ({"n_group": 3}, "n_group=3"),
        ({"n_group": 32}, "n_group=32"),
        ({"topk_group": 5}, "topk_group=5"),
        ({"qk_rope_head_dim": 7}, "qk_rope_head_dim=7"),
        ({"index_head_dim": 4}, "index_head_dim=4"),
        ({"first_k_dense_replace": 11}, "first_k_dense_replace=11"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"index_topk": 0}, "index_topk=0"),
    ],
)
def test_bad_config_raises_naming_value(changes, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        REDUCED.replace(**changes)


@pytest.mark.parametrize("block_size", [0, 100, 3, -16])
def test_block_size_must_be_power_of_two(block_size):
    with pytest.raises(ValueError, match=f"block_size={block_size}"):
        PagedKVCache(REDUCED, block_size)


def test_unknown_model_name():
    with pytest.raises(ValueError, match="'tiny'"):
        named_config("tiny")


def test_hf_config_round_trip(tmp_path):
    config = REDUCED.replace(name="x", index_topk=99, rope_theta=5000.0)
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_dict()))
    assert load_hf_config(tmp_path, name="x") == config


def test_hf_config_rejects_unsupported_rope():
    hf = REDUCED.to_hf_dict()
    hf["rope_parameters"] = {"rope_type": "yarn", "factor": 40, "rope_theta": 1e4}
    with pytest.raises(ValueError, match="rope_type='yarn'"):
        config_from_hf_dict(hf)


def test_config_is_hashable_value():
    assert ModelConfig(name="reduced") == REDUCED


def test_model_name_overrides():
    from pytest_afd.backends.cpu import parse_model_name

    config = parse_model_name("reduced:index_topk=65536,routed_scaling_factor=1.5")
    assert config.index_topk == 65536 and config.routed_scaling_factor == 1.5
    assert config.num_hidden_layers == 10
    assert parse_model_name("full") is FULL
    with pytest.raises(ValueError, match="'bogus=1'"):
        parse_model_name("reduced:bogus=1")
    with pytest.raises(ValueError, match="kv_lora_rank=0"):
        parse_model_name("reduced:kv_lora_rank=0")


def test_named_config_accepts_override_syntax():
    assert named_config("reduced:index_topk=4096").index_topk == 4096
    assert named_config("reduced:index_topk=4096", num_hidden_layers=4).num_hidden_layers == 4
