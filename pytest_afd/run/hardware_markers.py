"""Hardware markers: ``npu(devices=, soc=)`` and ``multi_node(nodes=)`` skip (or, under
``--afd-require-hardware``, fail) a test whose devices or nodes are missing."""

from __future__ import annotations

import os

import pytest

ENV_NUM_NODES = "AFD_NUM_NODES"
DEFAULT_NUM_NODES = 1
# Marker defaults: npu() alone means one NPU, multi_node() alone means two nodes.
DEFAULT_NPU_DEVICES = 1
DEFAULT_MULTI_NODE_NODES = 2


def _marker_count(marker: pytest.Mark, key: str, default: int) -> int:
    """``marker(key=N)`` or ``marker(N)`` as a positive int; anything else fails the test, naming it."""
    value = marker.kwargs.get(key, marker.args[0] if marker.args else default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise pytest.UsageError(
            f"@pytest.mark.{marker.name}({key}={value!r}): expected a positive int"
        )
    return value


def _available_nodes() -> int:
    text = os.environ.get(ENV_NUM_NODES, "").strip() or str(DEFAULT_NUM_NODES)
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        pytest.fail(f"${ENV_NUM_NODES}={text!r}: expected a positive integer", pytrace=False)
    return int(text)


def hardware_skip_reason(item: pytest.Item) -> str | None:
    npu = item.get_closest_marker("npu")
    if npu is not None:
        devices = _marker_count(npu, "devices", DEFAULT_NPU_DEVICES)
        soc = npu.kwargs.get("soc")
        available, found_soc, why = detect_npus()
        if available < devices:
            return f"needs {devices} NPU devices (npu marker), {available} available: {why}"
        if soc is not None and (found_soc is None or soc.lower() not in found_soc.lower()):
            return f"needs SoC {soc!r} (npu marker), found {found_soc!r}"
    multi = item.get_closest_marker("multi_node")
    if multi is not None:
        nodes = _marker_count(multi, "nodes", DEFAULT_MULTI_NODE_NODES)
        have = _available_nodes()
        if have < nodes:
            return f"needs {nodes} nodes (multi_node marker), {ENV_NUM_NODES}={have}"
    return None


def detect_npus() -> tuple[int, str | None, str]:
    """(device count, SoC name, explanation) without importing torch_npu when it is absent."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        return 0, None, "torch_npu is not installed"
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    count = torch.npu.device_count()
    if count == 0:
        return 0, None, "torch_npu found no NPU"
    return count, torch.npu.get_device_name(0), f"{count} NPU(s) visible"
