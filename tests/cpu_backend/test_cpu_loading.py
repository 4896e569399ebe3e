"""Bad checkpoints and configs are refused at load, naming the file, tensor or field."""

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from pytest_afd.backends.cpu import (
    REDUCED,
    DeepseekV32Model,
    init_weights,
    load_hf_config,
    load_pretrained,
    named_config,
    parse_model_name,
    save_pretrained,
)

SMALL = named_config("reduced", num_hidden_layers=4, first_k_dense_replace=1)
POISONED = "model.layers.2.mlp.experts.down_proj"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_weight_refused_naming_the_tensor(tmp_path, bad):
    weights = init_weights(SMALL, 0)
    weights[POISONED][1, 2, 3] = bad
    with pytest.raises(ValueError, match=rf"{POISONED}.*non-finite.*index \(1, 2, 3\)"):
        DeepseekV32Model(SMALL, weights)
    save_pretrained(SMALL, weights, tmp_path)
    with pytest.raises(ValueError, match=POISONED):
        load_pretrained(tmp_path)


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0.0, -1.0])
def test_bad_routed_scaling_factor_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="routed_scaling_factor"):
        REDUCED.replace(routed_scaling_factor=bad)
    hf = SMALL.to_hf_dict()
    hf["routed_scaling_factor"] = bad
    (tmp_path / "config.json").write_text(json.dumps(hf))  # json writes NaN / Infinity
    with pytest.raises(ValueError, match=r"config\.json.*routed_scaling_factor"):
        load_hf_config(tmp_path)


def test_tensor_redefined_by_a_second_shard_names_both(tmp_path):
    weights = init_weights(SMALL, 0)
    save_pretrained(SMALL, weights, tmp_path)
    name = "model.layers.1.self_attn.o_proj.weight"
    save_file({name: torch.zeros_like(weights[name])}, str(tmp_path / "model-00002.safetensors"))
    with pytest.raises(ValueError, match=rf"{name}.*two shards.*model-00002\.safetensors") as info:
        load_pretrained(tmp_path)
    assert "model.safetensors" in str(info.value)


def test_config_with_fewer_layers_than_the_checkpoint_refused(tmp_path):
    save_pretrained(SMALL, init_weights(SMALL, 0), tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    hf["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=r"layer\(s\) 3\.\.3 .*num_hidden_layers=3"):
        load_pretrained(tmp_path)


def test_stray_tensor_refused(tmp_path):
    weights = init_weights(SMALL, 0)
    weights["model.extra.weight"] = torch.zeros(2)
    save_pretrained(SMALL, weights, tmp_path)
    with pytest.raises(ValueError, match=r"model\.extra\.weight"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b'{"vocab_size": 2048, "hidden_', "not valid JSON"),
        (b"\xff\xfe\x00binary", "not a UTF-8 JSON file"),
        (b"[1, 2]", "expected a JSON object, got list"),
        (b"[" * 100_000, "JSON"),
    ],
)
def test_broken_config_json_names_the_file(tmp_path, content, named):
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ValueError, match=named) as info:
        load_hf_config(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)


def test_config_json_missing_key_names_file_and_key(tmp_path):
    hf = SMALL.to_hf_dict()
    del hf["num_attention_heads"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=r"config\.json.*missing key\(s\) \['num_attention_heads'\]"):
        load_hf_config(tmp_path)


@pytest.mark.parametrize(
    ("field", "value"),
    [("hidden_size", "64"), ("rms_norm_eps", "tiny"), ("n_shared_experts", None),
     ("first_k_dense_replace", [1]), ("norm_topk_prob", "yes")],
)  # fmt: skip
def test_config_json_non_numeric_value_names_file_and_field(tmp_path, field, value):
    hf = SMALL.to_hf_dict()
    hf[field] = value
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match=rf"config\.json.*{field}="):
        load_hf_config(tmp_path)


@pytest.mark.parametrize(
    "model_name",
    ["reduced:routed_scaling_factor=abc", "reduced:rms_norm_eps=NaN",
     "reduced:n_shared_experts=x", "reduced:first_k_dense_replace=one"],
)  # fmt: skip
def test_non_numeric_override_names_model_name_and_field(model_name):
    field = model_name.split(":")[1].split("=")[0]
    with pytest.raises(ValueError, match=rf"model name '{model_name}'.*{field}="):
        parse_model_name(model_name)
