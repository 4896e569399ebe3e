"""Embedded CPU backend: a DeepSeek V3.2-structured model (tiny width) and its executor.

Public API (docs/contracts.md, "CPU model structure"; usage in docs/cpu-backend.md):
``ModelConfig``, the named configs ``reduced`` / ``full`` (:func:`named_config`),
:func:`build_model`, the model's per-layer pieces, :class:`PagedKVCache` /
:class:`BlockPool`, :class:`Executor` and :func:`create` (the backend factory).
"""

from __future__ import annotations

from pathlib import Path

from pytest_afd.backends.cpu.afd.runtime import DEFAULT_PEER_TIMEOUT_S
from pytest_afd.backends.cpu.backend import CAPABILITIES, CpuBackend
from pytest_afd.backends.cpu.config import (
    FULL,
    NAMED_CONFIGS,
    REDUCED,
    ModelConfig,
    config_from_hf_dict,
    load_hf_config,
    named_config,
    parse_model_name,
)
from pytest_afd.backends.cpu.executor import ExecOutput, Executor
from pytest_afd.backends.cpu.kv_cache import DEFAULT_BLOCK_SIZE, BlockPool, PagedKVCache
from pytest_afd.backends.cpu.model import DecoderLayer, DeepseekV32Model, build_model
from pytest_afd.backends.cpu.ops import Linear, select_topk
from pytest_afd.backends.cpu.run_evidence import load_per_rank, split_layout
from pytest_afd.backends.cpu.weights import init_weights, load_pretrained, save_pretrained


def create(*, topology, model_name: str, seed: int, results_dir: str | Path | None = None,
           peer_timeout_s: float = DEFAULT_PEER_TIMEOUT_S) -> CpuBackend:
    """Backend factory used by ``pytest_afd.backends.create_backend("cpu", ...)``.

    ``model_name`` is a named config (``reduced`` / ``full``, seeded weights),
    optionally with overrides (``reduced:index_topk=65536``), or a directory
    holding a Hugging Face-style ``config.json`` + ``*.safetensors``.
    ``peer_timeout_s`` bounds the AFD runtime's waits for a peer rank.
    """
    model_dir = None
    if model_name.partition(":")[0] in NAMED_CONFIGS:
        model = build_model(parse_model_name(model_name), seed)
    elif Path(model_name).is_dir():
        config, weights = load_pretrained(model_name, name=Path(model_name).name)
        model = DeepseekV32Model(config, weights)
        model_dir = model_name
    else:
        raise ValueError(
            f"model_name={model_name!r}; expected one of {sorted(NAMED_CONFIGS)} or a directory "
            "with config.json + *.safetensors"
        )
    return CpuBackend(model, topology=topology, seed=seed, results_dir=results_dir,
                      model_dir=model_dir, peer_timeout_s=peer_timeout_s)


__all__ = [
    "CAPABILITIES",
    "DEFAULT_BLOCK_SIZE",
    "FULL",
    "NAMED_CONFIGS",
    "REDUCED",
    "BlockPool",
    "CpuBackend",
    "DecoderLayer",
    "DeepseekV32Model",
    "ExecOutput",
    "Executor",
    "Linear",
    "ModelConfig",
    "PagedKVCache",
    "build_model",
    "config_from_hf_dict",
    "create",
    "init_weights",
    "load_hf_config",
    "load_per_rank",
    "load_pretrained",
    "named_config",
    "parse_model_name",
    "save_pretrained",
    "select_topk",
    "split_layout",
]
