"""vLLM-Ascend backend: launch plans (``afd-launch-plan``) and servers driven over HTTP.

Importing this package imports neither vLLM nor torch-npu; :func:`create`
raises :class:`~pytest_afd.core.backend.BackendUnavailable` with the reason
when servers cannot be launched or attached to here.
"""

from __future__ import annotations

from pathlib import Path

from pytest_afd.backends.vllm_ascend.launch import (
    LaunchOptions,
    LaunchPlan,
    LaunchPlanError,
    ProcessPlan,
    build_launch_plan,
    validate_plan,
)
from pytest_afd.serving.http_backend import HttpBackend
from pytest_afd.topology.spec import Topology


def create(*, topology: Topology, model_name: str, seed: int, results_dir: str | Path,
           devices_per_node: int | None = None) -> HttpBackend:
    """Backend factory used by ``create_backend("vllm-ascend", ...)``."""
    from pytest_afd.backends.vllm_ascend.backend import create_backend

    return create_backend(topology=topology, model_name=model_name, seed=seed,
                          results_dir=results_dir, devices_per_node=devices_per_node)


__all__ = [
    "LaunchOptions",
    "LaunchPlan",
    "LaunchPlanError",
    "ProcessPlan",
    "build_launch_plan",
    "create",
    "validate_plan",
]
