"""``npu-smi`` samples per device during measured (non-instrumented) repetitions.

Per device and sample: ``npu-smi info -t usages -i <id>`` ("HBM Capacity(MB)",
"HBM Usage Rate(%)", "Aicore Usage Rate(%)") and ``npu-smi info -t power -i
<id>`` ("NPU Real-time Power(W)"; older drivers: "Power Dissipation(W)"). HBM
used is capacity x usage rate (1 % resolution: npu-smi gives no byte count
there). A sample is taken when the run starts, every ``interval_s`` while it
runs and when it ends, so even a short run has two. Peak and mean go per role
(the devices of a role's processes: ``ASCEND_RT_VISIBLE_DEVICES`` in the plan).
Without ``npu-smi`` the record is absent with the reason.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from statistics import fmean
from typing import Any

from pytest_afd.results.manifest import absent

NPU_SMI = "npu-smi"
DEFAULT_INTERVAL_S = 1.0
COMMAND_TIMEOUT_S = 10
BYTES_PER_MB = 1 << 20
PERCENT = 100.0
_FIELDS = {
    "hbm_capacity_mb": ("HBM Capacity(MB)",),
    "hbm_usage_percent": ("HBM Usage Rate(%)",),
    "aicore_percent": ("Aicore Usage Rate(%)", "AI Core Usage Rate(%)"),
    "power_w": ("NPU Real-time Power(W)", "Power Dissipation(W)"),
}
METRICS = ("hbm_used_bytes", "power_w", "aicore_percent")


def parse_fields(text: str) -> dict[str, float]:
    """The numeric ``Key : value`` fields of npu-smi output that this module reads."""
    values: dict[str, float] = {}
    for name, keys in _FIELDS.items():
        for key in keys:
            match = re.search(rf"^\s*{re.escape(key)}\s*:\s*([-+0-9.]+)", text, re.M)
            if match:
                values[name] = float(match.group(1))
                break
    return values


def sample_device(device: int, command: str = NPU_SMI) -> dict[str, float]:
    """One sample of ``device``: HBM used bytes, power and AI Core utilization (what is given)."""
    text = ""
    for kind in ("usages", "power"):
        done = subprocess.run([command, "info", "-t", kind, "-i", str(device)],
                              capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                              check=False)
        text += done.stdout + "\n"
    fields = parse_fields(text)
    sample = {k: fields[k] for k in ("power_w", "aicore_percent") if k in fields}
    if "hbm_capacity_mb" in fields and "hbm_usage_percent" in fields:
        sample["hbm_used_bytes"] = (fields["hbm_capacity_mb"] * fields["hbm_usage_percent"]
                                    / PERCENT * BYTES_PER_MB)
    return sample


def summarize(samples_by_role: Mapping[str, Sequence[Mapping[str, float]]]) -> dict[str, Any]:
    """Peak and mean of each metric per role (over its devices and samples)."""
    per_role: dict[str, Any] = {}
    for role, samples in samples_by_role.items():
        metrics: dict[str, Any] = {}
        for metric in METRICS:
            values = [s[metric] for s in samples if metric in s]
            metrics[metric] = ({"peak": max(values), "mean": fmean(values), "count": len(values)}
                               if values else absent(f"npu-smi gave no {metric} for {role}"))
        per_role[role] = metrics
    return per_role


class _Handle:
    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.samples: dict[str, list[dict[str, float]]] = {r: [] for r in sampler.devices}
        self.rounds = 0
        self._stop = threading.Event()
        self._take()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _take(self) -> None:
        for role, devices in self.sampler.devices.items():
            for device in devices:
                sample = sample_device(device, self.sampler.command)
                if sample:
                    self.samples[role].append(sample)
        self.rounds += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.sampler.interval_s):
            self._take()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        self._take()
        return {"tool": self.sampler.command, "interval_s": self.sampler.interval_s,
                "num_samples": self.rounds,
                "devices": {r: list(d) for r, d in self.sampler.devices.items()},
                "per_role": summarize(self.samples)}


class Sampler:
    """Samples the devices of each role while a measured run runs."""

    def __init__(self, devices: Mapping[str, Sequence[int]], *,
                 interval_s: float = DEFAULT_INTERVAL_S, command: str = NPU_SMI) -> None:
        if interval_s <= 0:
            raise ValueError(f"device-metrics interval_s={interval_s!r}: expected > 0")
        self.devices = {role: tuple(ids) for role, ids in devices.items()}
        self.interval_s = interval_s
        self.command = command

    @classmethod
    def available(cls, devices: Mapping[str, Sequence[int]], **kwargs) -> Sampler | None:
        """A sampler when ``npu-smi`` is on PATH, else None (see :func:`unavailable`)."""
        if shutil.which(kwargs.get("command", NPU_SMI)) is None:
            return None
        return cls(devices, **kwargs)

    def start(self) -> _Handle:
        return _Handle(self)

    def describe(self) -> dict[str, Any]:
        return {"tool": self.command, "interval_s": self.interval_s,
                "devices": {r: list(d) for r, d in self.devices.items()}}


def unavailable(command: str = NPU_SMI) -> dict[str, Any]:
    return absent(f"`{command}` is not on PATH: no device metrics on this machine")


def plan_devices(plan) -> dict[str, list[int]]:
    """Role -> device ids of a launch plan (its processes' ``ASCEND_RT_VISIBLE_DEVICES``)."""
    devices: dict[str, list[int]] = {}
    for process in plan.processes:
        visible = dict(process.env).get("ASCEND_RT_VISIBLE_DEVICES", "")
        ids = [int(x) for x in visible.split(",") if x.strip()] or list(process.devices)
        devices.setdefault(process.role, []).extend(ids)
    return devices


def layout_devices(topology, devices_per_node: int) -> dict[str, list[int]]:
    """Role -> device ids on node 0 of ``topology``'s rank layout (launch mode: one node)."""
    devices: dict[str, list[int]] = {}
    for info in topology.rank_layout(devices_per_node):
        if info.node == 0:
            devices.setdefault(info.role, []).append(info.device)
    return devices
