"""Embedded CPU backend: a DeepSeek V3.2-structured model (tiny width) and its executor.

Public API (docs/contracts.md, "CPU model structure"; usage in docs/cpu-backend.md):
``ModelConfig``, the named configs ``reduced`` / ``full`` (:func:`named_config`),
:func:`build_model`, the model's per-layer pieces, :class:`PagedKVCache` /
:class:`BlockPool`, :class:`Executor` and :func:`create` (the backend factory).

The names load on first use (PEP 562): reading a named config
(``pytest_afd.backends.cpu.config``, as the plugin's option checks do in every pytest
process, xdist's controller included) imports no torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CAPABILITIES": "backend",
    "CpuBackend": "backend",
    "FULL": "config",
    "NAMED_CONFIGS": "config",
    "REDUCED": "config",
    "ModelConfig": "config",
    "config_from_hf_dict": "config",
    "load_hf_config": "config",
    "named_config": "config",
    "parse_model_name": "config",
    "ExecOutput": "executor",
    "Executor": "executor",
    "create": "factory",
    "DEFAULT_BLOCK_SIZE": "kv_cache",
    "BlockPool": "kv_cache",
    "PagedKVCache": "kv_cache",
    "DecoderLayer": "model",
    "DeepseekV32Model": "model",
    "build_model": "model",
    "Linear": "ops",
    "select_topk": "ops",
    "load_per_rank": "run_evidence",
    "split_layout": "run_evidence",
    "init_weights": "weights",
    "load_pretrained": "weights",
    "save_pretrained": "weights",
}
"""Public name -> the submodule defining it (imported on first use)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
