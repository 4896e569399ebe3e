"""Backend registry: ``create_backend(name, ...)`` imports the backend module lazily.

``"cpu"`` → :func:`pytest_afd.backends.cpu.create`, ``"vllm-ascend"`` →
:func:`pytest_afd.backends.vllm_ascend.create`. Importing this package imports
neither, so vLLM / torch-npu are only touched when that backend is asked for.
A backend that cannot run here raises :class:`BackendUnavailable`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import MappingProxyType

from pytest_afd.core.backend import Backend, BackendUnavailable

BACKEND_MODULES = MappingProxyType(
    {
        "cpu": "pytest_afd.backends.cpu",
        "vllm-ascend": "pytest_afd.backends.vllm_ascend",
    }
)
BACKEND_NAMES = tuple(BACKEND_MODULES)


def create_backend(
    name: str,
    *,
    topology,
    model_name: str,
    seed: int,
    results_dir: str | Path,
    peer_timeout_s: float | None = None,
    devices_per_node: int | None = None,
) -> Backend:
    """Create the named backend for ``topology`` (a :class:`pytest_afd.topology.spec.Topology`).

    ``peer_timeout_s``: the CPU AFD runtime's peer timeout (None: its default);
    only the CPU backend runs that runtime, so another backend refuses it.
    ``devices_per_node``: the nodes' NPU count the user gave (``--afd-devices-per-node``);
    None: the backend finds it (environment, ``npu-smi``); the CPU backend refuses it.
    """
    if name not in BACKEND_MODULES:
        raise ValueError(f"unknown backend {name!r}; expected one of {BACKEND_NAMES}")
    if peer_timeout_s is not None and name != "cpu":
        raise ValueError(f"peer_timeout_s={peer_timeout_s!r} applies to the CPU backend's AFD "
                         f"runtime only, not to backend {name!r}")
    module_name = BACKEND_MODULES[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only the backend package itself missing means "not available here";
        # a missing dependency inside it is a real error and propagates.
        if exc.name != module_name:
            raise
        raise BackendUnavailable(
            f"backend {name!r}: module {module_name} is not installed"
        ) from exc
    if devices_per_node is not None and name == "cpu":
        raise ValueError(f"devices_per_node={devices_per_node!r} applies to a hardware backend, "
                         "not to the CPU backend")
    extra = {} if peer_timeout_s is None else {"peer_timeout_s": peer_timeout_s}
    if devices_per_node is not None:
        extra["devices_per_node"] = devices_per_node
    return module.create(
        topology=topology, model_name=model_name, seed=seed, results_dir=results_dir, **extra
    )
