"""Seeded weights for the CPU model and Hugging Face-style (config.json + safetensors) I/O.

Tensor names and shapes are transformers' ``DeepseekV32ForCausalLM`` ones, so the
same state dict loads into the reference implementation. Every tensor is drawn
from its own generator seeded by (seed, name): the weights do not depend on
creation order, and the ``reduced`` model's layers equal the ``full`` model's
first ten layers with the same seed, as in the recipe.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

import torch

from pytest_afd.backends.cpu.config import ModelConfig, load_hf_config

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# Norm weights are drawn around 1 (not exactly 1) so a loader that drops them is caught.
NORM_WEIGHT_JITTER = 0.1
ROUTER_BIAS_STD = 0.05
EMBEDDING_STD = 1.0
SEED_DIGEST_BYTES = 8
_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")
_PER_EXPERT_KEY = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")

Weights = dict[str, torch.Tensor]


def layer_prefix(layer_index: int) -> str:
    return f"model.layers.{layer_index}."


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the model needs (transformers' layout)."""
    c = config
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
        "model.norm.weight": (c.hidden_size,),
        "lm_head.weight": (c.vocab_size, c.hidden_size),
    }
    shared = c.moe_intermediate_size * c.n_shared_experts
    for index in range(c.num_hidden_layers):
        p = layer_prefix(index)
        a = p + "self_attn."
        shapes.update({
            p + "input_layernorm.weight": (c.hidden_size,),
            p + "post_attention_layernorm.weight": (c.hidden_size,),
            a + "q_a_proj.weight": (c.q_lora_rank, c.hidden_size),
            a + "q_a_layernorm.weight": (c.q_lora_rank,),
            a + "q_b_proj.weight": (c.num_attention_heads * c.qk_head_dim, c.q_lora_rank),
            a + "kv_a_proj_with_mqa.weight": (c.kv_lora_rank + c.qk_rope_head_dim, c.hidden_size),
            a + "kv_a_layernorm.weight": (c.kv_lora_rank,),
            a + "kv_b_proj.weight": (
                c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank,
            ),
            a + "o_proj.weight": (c.hidden_size, c.num_attention_heads * c.v_head_dim),
            a + "indexer.wq_b.weight": (c.index_n_heads * c.index_head_dim, c.q_lora_rank),
            a + "indexer.wk.weight": (c.index_head_dim, c.hidden_size),
            a + "indexer.k_norm.weight": (c.index_head_dim,),
            a + "indexer.k_norm.bias": (c.index_head_dim,),
            a + "indexer.weights_proj.weight": (c.index_n_heads, c.hidden_size),
        })  # fmt: skip
        m = p + "mlp."
        if c.is_moe_layer(index):
            shapes.update({
                m + "gate.weight": (c.n_routed_experts, c.hidden_size),
                m + "gate.e_score_correction_bias": (c.n_routed_experts,),
                m + "experts.gate_up_proj": (
                    c.n_routed_experts, 2 * c.moe_intermediate_size, c.hidden_size,
                ),
                m + "experts.down_proj": (c.n_routed_experts, c.hidden_size, c.moe_intermediate_size),
            })  # fmt: skip
            if shared:
                shapes.update({
                    m + "shared_experts.gate_proj.weight": (shared, c.hidden_size),
                    m + "shared_experts.up_proj.weight": (shared, c.hidden_size),
                    m + "shared_experts.down_proj.weight": (c.hidden_size, shared),
                })  # fmt: skip
        else:
            shapes.update({
                m + "gate_proj.weight": (c.intermediate_size, c.hidden_size),
                m + "up_proj.weight": (c.intermediate_size, c.hidden_size),
                m + "down_proj.weight": (c.hidden_size, c.intermediate_size),
            })  # fmt: skip
    return shapes


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:SEED_DIGEST_BYTES], "little") >> 1


def _draw(seed: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(_tensor_seed(seed, name))
    noise = torch.randn(shape, generator=generator, dtype=torch.float32)
    if name.endswith("norm.weight"):
        return 1.0 + NORM_WEIGHT_JITTER * noise
    if name.endswith("norm.bias"):
        return NORM_WEIGHT_JITTER * noise
    if name.endswith("e_score_correction_bias"):
        return ROUTER_BIAS_STD * noise
    if name == "model.embed_tokens.weight":
        return EMBEDDING_STD * noise
    # Fan-in scaling keeps activations O(1) through any depth of tiny layers.
    return noise / math.sqrt(shape[-1])


def init_weights(config: ModelConfig, seed: int) -> Weights:
    """Deterministic random weights: same (config, seed) -> same bits on every run."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r}; expected a non-negative integer")
    return {name: _draw(seed, name, shape) for name, shape in expected_shapes(config).items()}


def _pack_per_expert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Original-checkpoint layout (``experts.{e}.gate_proj``...) -> transformers' packed tensors."""
    per_expert: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    packed = {}
    for name, tensor in state.items():
        match = _PER_EXPERT_KEY.match(name)
        if match is None:
            packed[name] = tensor
            continue
        prefix, expert, proj = match.group(1), int(match.group(2)), match.group(3)
        per_expert.setdefault(prefix, {}).setdefault(expert, {})[proj] = tensor
    for prefix, experts in per_expert.items():
        order = sorted(experts)
        if order != list(range(len(order))):
            raise ValueError(f"{prefix}: expert indices {order} are not 0..{len(order) - 1}")
        packed[prefix + ".gate_up_proj"] = torch.stack(
            [torch.cat([experts[e]["gate"], experts[e]["up"]], dim=0) for e in order]
        )
        packed[prefix + ".down_proj"] = torch.stack([experts[e]["down"] for e in order])
    return packed


def check_weights(config: ModelConfig, weights: Weights) -> Weights:
    """Keep the tensors the config needs (float32), raising on a missing, misshapen or
    non-finite one (a NaN or Inf weight would only show as all-NaN logits later)."""
    checked = {}
    for name, shape in expected_shapes(config).items():
        if name not in weights:
            raise ValueError(f"weight {name!r} is missing from the state dict")
        tensor = weights[name]
        if tuple(tensor.shape) != shape:
            raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}; config needs {shape}")
        tensor = tensor.to(torch.float32).contiguous()
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            first = tuple(int(i) for i in torch.nonzero(~finite)[0])
            raise ValueError(
                f"weight {name!r} has {bad} non-finite value(s) (NaN/Inf), first at index "
                f"{first}: {float(tensor[first])}"
            )
        checked[name] = tensor
    return checked


def check_no_unused(config: ModelConfig, weights: Weights, source: str) -> None:
    """A checkpoint tensor the config does not use means config and checkpoint disagree."""
    unused = sorted(set(weights) - set(expected_shapes(config)))
    if not unused:
        return
    layers = sorted({int(m.group(1)) for m in map(_LAYER_KEY.match, unused) if m})
    beyond = [layer for layer in layers if layer >= config.num_hidden_layers]
    if beyond:
        raise ValueError(
            f"{source}: the checkpoint has layer(s) {beyond[0]}..{beyond[-1]} but its config "
            f"has num_hidden_layers={config.num_hidden_layers}: {len(unused)} tensor(s) would "
            f"be ignored, e.g. {unused[0]!r}"
        )
    raise ValueError(
        f"{source}: {len(unused)} checkpoint tensor(s) the config does not use, e.g. {unused[:3]}"
    )


def read_shards(files: list[Path]) -> Weights:
    """Every tensor of every shard; a tensor defined by two shards is an error naming both."""
    from safetensors.torch import load_file

    state: Weights = {}
    origin: dict[str, Path] = {}
    for path in files:
        for name, tensor in load_file(str(path)).items():
            if name in origin:
                raise ValueError(
                    f"tensor {name!r} is defined by two shards: {str(origin[name])!r} and "
                    f"{str(path)!r}"
                )
            origin[name] = path
            state[name] = tensor
    return state


def load_pretrained(directory: str | Path, *, name: str = "custom") -> tuple[ModelConfig, Weights]:
    """Load ``config.json`` + ``*.safetensors`` from a Hugging Face-style directory."""
    directory = Path(directory)
    config = load_hf_config(directory / CONFIG_FILE, name=name)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors file in {str(directory)!r}")
    state = _pack_per_expert(read_shards(files))
    check_no_unused(config, state, str(directory))
    return config, check_weights(config, state)


def save_pretrained(config: ModelConfig, weights: Weights, directory: str | Path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (the layout :func:`load_pretrained` reads)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(config.to_hf_dict(), indent=2, sort_keys=True))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(directory / WEIGHTS_FILE))
    return directory


def weights_digest(weights: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].numpy().tobytes())
    return digest.hexdigest()
