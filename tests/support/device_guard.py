"""A TorchDispatchMode that records every op and fails on any host sync of a device tensor.

Device tensors are stood in for by ``meta`` tensors (a distinct, data-less
device), host tensors are CPU tensors. The guard raises ``DeviceSyncError`` on
``aten::_local_scalar_dense`` of a device tensor (``.item()``, ``int()``,
``bool()``) and on any op that takes a device tensor and returns a CPU tensor
(``.cpu()``, ``.tolist()``, ``.to("cpu")``, ``copy_`` into a host tensor); it
raises before the op runs, so the failure names the op, not meta's own error.
"""

from __future__ import annotations

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

DEVICE = "meta"
LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default


class DeviceSyncError(AssertionError):
    """A device tensor was read on the host."""


def _on_device(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == DEVICE


def _host_target(func, args, kwargs) -> bool:
    """True when ``func`` would write its result into host memory."""
    if func is torch.ops.aten._to_copy.default:
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == "cpu"
    if func is torch.ops.aten.copy_.default:
        return isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu"
    return False


class DeviceSyncGuard(TorchDispatchMode):
    """Records ``(op, touched_device)`` for every op; fails on a device-to-host read."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        touched = any(_on_device(leaf) for leaf in pytree.tree_leaves((args, kwargs)))
        self.ops.append((str(func), touched))
        if touched and func is LOCAL_SCALAR:
            raise DeviceSyncError(f"{func}: reads a device scalar on the host")
        if touched and _host_target(func, args, kwargs):
            raise DeviceSyncError(f"{func}: copies a device tensor to the host")
        out = func(*args, **kwargs)
        if touched and any(
            isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu"
            for leaf in pytree.tree_leaves(out)
        ):
            raise DeviceSyncError(f"{func}: returned a host tensor from a device input")
        return out

    def device_ops(self) -> set[str]:
        """The distinct ops that touched a device tensor."""
        return {name for name, touched in self.ops if touched}
