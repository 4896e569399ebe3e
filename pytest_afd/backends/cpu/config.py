"""Model configuration of the embedded CPU model (DeepSeek V3.2 structure, tiny width).

The field names are the Hugging Face ``DeepseekV32Config`` names so a config can
round-trip through ``config.json`` and the same weights load into transformers'
reference implementation for the parity test.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ACTIVATION = "silu"
SUPPORTED_ROPE_TYPE = "default"
# The group score of group-limited routing is the sum of a group's top-2 experts.
GROUP_SCORE_TOP = 2
HF_MODEL_TYPE = "deepseek_v32"
HF_ARCHITECTURE = "DeepseekV32ForCausalLM"
# Separates a named config from its field overrides in a model name.
OVERRIDE_SEPARATOR = ":"
# Fields that fix tensor shapes: a config.json without one cannot describe its checkpoint.
REQUIRED_HF_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
    "num_hidden_layers", "first_k_dense_replace", "num_attention_heads", "q_lora_rank",
    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
    "num_experts_per_tok",
)  # fmt: skip
POSITIVE_FLOAT_FIELDS = ("routed_scaling_factor", "rms_norm_eps", "rope_theta")


@dataclass(frozen=True)
class ModelConfig:
    """DeepSeek-V3-architecture hyper-parameters plus the V3.2 indexer (DSA) ones."""

    name: str = "custom"
    vocab_size: int = 2048
    hidden_size: int = 64
    intermediate_size: int = 128
    moe_intermediate_size: int = 32
    num_hidden_layers: int = 10
    first_k_dense_replace: int = 3
    num_attention_heads: int = 2
    q_lora_rank: int = 32
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    n_routed_experts: int = 32
    n_shared_experts: int = 1
    num_experts_per_tok: int = 4
    n_group: int = 4
    topk_group: int = 2
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 2.5
    index_n_heads: int = 2
    index_head_dim: int = 16
    index_topk: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 163840
    hidden_act: str = SUPPORTED_ACTIVATION

    def __post_init__(self) -> None:
        validate_config(self)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def moe_layer_indices(self) -> tuple[int, ...]:
        return tuple(range(self.first_k_dense_replace, self.num_hidden_layers))

    def is_moe_layer(self, layer_index: int) -> bool:
        return layer_index >= self.first_k_dense_replace

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_hf_dict(self) -> dict[str, Any]:
        """``config.json`` content understood by transformers' ``DeepseekV32Config``."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields.pop("name")
        fields.pop("rope_theta")
        return {
            "architectures": [HF_ARCHITECTURE],
            "model_type": HF_MODEL_TYPE,
            **fields,
            "num_key_value_heads": self.num_attention_heads,
            "rope_parameters": {"rope_type": SUPPORTED_ROPE_TYPE, "rope_theta": self.rope_theta},
            "tie_word_embeddings": False,
            "attention_bias": False,
        }


def _require_positive(config: ModelConfig, names: tuple[str, ...]) -> None:
    for field_name in names:
        value = getattr(config, field_name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{field_name}={value!r}; expected a positive integer")


def _require_positive_finite(config: ModelConfig, names: tuple[str, ...]) -> None:
    for field_name in names:
        value = getattr(config, field_name)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{field_name}={value!r}; expected a positive finite number")


def _require_type(config: ModelConfig, field_name: str, kind: type) -> None:
    value = getattr(config, field_name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{field_name}={value!r}; expected a {kind.__name__}")


def validate_config(config: ModelConfig) -> None:
    """Reject configs the model cannot run, naming the offending value."""
    _require_type(config, "n_shared_experts", int)
    _require_type(config, "first_k_dense_replace", int)
    _require_type(config, "norm_topk_prob", bool)
    _require_type(config, "hidden_act", str)
    _require_positive_finite(config, POSITIVE_FLOAT_FIELDS)
    _require_positive(
        config,
        (
            "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
            "num_hidden_layers", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
            "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
            "num_experts_per_tok", "n_group", "topk_group", "index_n_heads",
            "index_head_dim", "index_topk", "max_position_embeddings",
        ),
    )  # fmt: skip
    if config.n_shared_experts < 0:
        raise ValueError(f"n_shared_experts={config.n_shared_experts!r}; expected >= 0")
    if not 0 <= config.first_k_dense_replace <= config.num_hidden_layers:
        raise ValueError(
            f"first_k_dense_replace={config.first_k_dense_replace!r}; expected 0.."
            f"{config.num_hidden_layers} (num_hidden_layers)"
        )
    if config.num_experts_per_tok > config.n_routed_experts:
        raise ValueError(
            f"num_experts_per_tok={config.num_experts_per_tok!r} is larger than "
            f"n_routed_experts={config.n_routed_experts!r}"
        )
    if config.n_routed_experts % config.n_group:
        raise ValueError(
            f"n_routed_experts={config.n_routed_experts!r} is not divisible by "
            f"n_group={config.n_group!r}"
        )
    experts_per_group = config.n_routed_experts // config.n_group
    if experts_per_group < GROUP_SCORE_TOP:
        raise ValueError(
            f"n_group={config.n_group!r} leaves {experts_per_group} expert(s) per group; "
            f"group scoring needs >= {GROUP_SCORE_TOP}"
        )
    if config.topk_group > config.n_group:
        raise ValueError(f"topk_group={config.topk_group!r} is larger than n_group={config.n_group!r}")
    if config.num_experts_per_tok > config.topk_group * experts_per_group:
        raise ValueError(
            f"num_experts_per_tok={config.num_experts_per_tok!r} exceeds the "
            f"{config.topk_group * experts_per_group} experts of topk_group={config.topk_group} groups"
        )
    if config.qk_rope_head_dim % 2:
        raise ValueError(f"qk_rope_head_dim={config.qk_rope_head_dim!r}; expected an even number")
    if config.index_head_dim < config.qk_rope_head_dim:
        raise ValueError(
            f"index_head_dim={config.index_head_dim!r} is smaller than "
            f"qk_rope_head_dim={config.qk_rope_head_dim!r} (the indexer ropes that many dims)"
        )
    if config.hidden_act != SUPPORTED_ACTIVATION:
        raise ValueError(f"hidden_act={config.hidden_act!r}; only {SUPPORTED_ACTIVATION!r} is supported")


# The recipe's reduced model is the first ten layers of the real one (3 dense +
# 7 MoE); the full one has the real 61 layers. Width is tiny so both run here.
REDUCED = ModelConfig(name="reduced", num_hidden_layers=10)
FULL = ModelConfig(name="full", num_hidden_layers=61)
NAMED_CONFIGS: dict[str, ModelConfig] = {"reduced": REDUCED, "full": FULL}


def named_config(name: str, **overrides: Any) -> ModelConfig:
    """A named config (``reduced`` / ``full``), optionally with fields replaced.

    ``name`` may carry overrides itself (``reduced:index_topk=65536``, see
    :func:`parse_model_name`), so a model-name option passes straight through.
    """
    if OVERRIDE_SEPARATOR in name:
        return parse_model_name(name).replace(**overrides) if overrides else parse_model_name(name)
    if name not in NAMED_CONFIGS:
        raise ValueError(f"model name {name!r}; expected one of {sorted(NAMED_CONFIGS)}")
    return NAMED_CONFIGS[name].replace(**overrides) if overrides else NAMED_CONFIGS[name]


def parse_model_name(model_name: str) -> ModelConfig:
    """A named config, optionally with field overrides after a colon.

    Example: ``reduced:index_topk=65536`` keeps the V3.2 indexer dense for prompts
    up to 64k tokens (what exactness gates need); values are JSON literals.
    """
    name, _, overrides_text = model_name.partition(OVERRIDE_SEPARATOR)
    overrides: dict[str, Any] = {}
    known = {f.name for f in dataclasses.fields(ModelConfig)} - {"name"}
    for item in filter(None, overrides_text.split(",")):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or key not in known:
            raise ValueError(
                f"model override {item!r} in {model_name!r}; expected field=value with a field of "
                f"ModelConfig"
            )
        try:
            overrides[key] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key] = raw
    try:
        config = named_config(name, **overrides)
        return config.replace(name=model_name) if overrides else config
    except ValueError as error:
        raise ValueError(f"model name {model_name!r}: {error}") from None


def config_from_hf_dict(hf: dict[str, Any], *, name: str = "custom") -> ModelConfig:
    """Read the fields we model from a Hugging Face DeepSeek V3/V3.2 ``config.json``."""
    if not isinstance(hf, dict):
        raise ValueError(f"expected a JSON object, got {type(hf).__name__}")
    missing = [key for key in REQUIRED_HF_KEYS if key not in hf]
    if missing:
        raise ValueError(f"missing key(s) {missing}")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"rope_parameters={rope!r}; expected an object")
    rope_type = rope.get("rope_type", rope.get("type", SUPPORTED_ROPE_TYPE))
    if rope_type != SUPPORTED_ROPE_TYPE:
        raise ValueError(f"rope_type={rope_type!r}; only {SUPPORTED_ROPE_TYPE!r} RoPE is supported")
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads", heads)
    if kv_heads != heads:
        raise ValueError(f"num_key_value_heads={kv_heads!r}; MLA needs num_attention_heads={heads}")
    known = {f.name for f in dataclasses.fields(ModelConfig)} - {"name", "rope_theta"}
    values = {key: hf[key] for key in known if key in hf}
    theta = rope.get("rope_theta", hf.get("rope_theta"))
    if theta is not None:
        values["rope_theta"] = float(theta) if type(theta) is int else theta
    return ModelConfig(name=name, **values)


def load_hf_config(path: str | Path, *, name: str = "custom") -> ModelConfig:
    """``path`` is a ``config.json`` file or a directory holding one.

    Every failure (unreadable, not UTF-8, not JSON, a missing key, a bad value)
    is a ValueError that names the file and, where there is one, the field.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as error:
        raise ValueError(f"{str(path)!r}: cannot read the model config: {error}") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{str(path)!r}: not a UTF-8 JSON file ({error})") from None
    try:
        hf = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{str(path)!r}: not valid JSON: {error}") from None
    except RecursionError:
        raise ValueError(f"{str(path)!r}: JSON nested too deeply") from None
    try:
        return config_from_hf_dict(hf, name=name)
    except ValueError as error:
        raise ValueError(f"{str(path)!r}: {error}") from None
