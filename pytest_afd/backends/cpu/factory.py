"""The CPU backend's factory: ``pytest_afd.backends.create_backend("cpu", ...)`` calls it."""

from __future__ import annotations

from pathlib import Path

from pytest_afd.backends.cpu.afd.runtime import DEFAULT_PEER_TIMEOUT_S
from pytest_afd.backends.cpu.backend import CpuBackend
from pytest_afd.backends.cpu.config import NAMED_CONFIGS, parse_model_name
from pytest_afd.backends.cpu.model import DeepseekV32Model, build_model
from pytest_afd.backends.cpu.weights import load_pretrained


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
