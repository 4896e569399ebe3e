"""What one CPU run reports beside its outputs: split layout, EP load, timings, AFD step fields.

Small pure functions over the run's own numbers, kept apart from :mod:`.backend`, which
schedules, plans and executes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_afd.core.backend import RunSettings

# AFD-runtime step evidence lifted to the top level of each step (Stage A reads them).
AFD_STEP_SUMMARY_KEYS = ("overlap_fraction", "straggler_s", "exposed_bubble_s", "ffn_idle_s")


@dataclass(frozen=True)
class SplitLayout:
    """The split constraints and EP accounting one run uses, and where they came from."""

    split_align: int
    pcp_size: int
    num_ep_ranks: int
    source: str


def split_layout(settings: RunSettings, topology) -> SplitLayout:
    """Explicit settings win; ``None`` takes the topology's documented CPU
    emulation (``Topology.cpu_emulation()``) for align / PCP; EP always comes from it."""
    if topology is None:
        return SplitLayout(settings.split_align or 1, settings.pcp_size or 1, 1, "settings")
    emulation = topology.cpu_emulation()
    align = emulation.split_align if settings.split_align is None else settings.split_align
    pcp = emulation.pcp_size if settings.pcp_size is None else settings.pcp_size
    return SplitLayout(align, pcp, emulation.num_ep_ranks, f"topology {topology.canonical}")


def load_per_rank(load: np.ndarray, num_ep_ranks: int) -> np.ndarray:
    """[layers, experts] -> [layers, ranks]: rank r owns the r-th contiguous expert range."""
    if num_ep_ranks < 1:
        raise ValueError(f"num_ep_ranks={num_ep_ranks}; expected >= 1")
    bounds = [part[0] for part in np.array_split(np.arange(load.shape[1]), num_ep_ranks) if len(part)]
    return np.add.reduceat(load, bounds, axis=1)


def add_layer_seconds(total: list[list[dict[str, float]]],
                      step: list[list[dict[str, float]]]) -> None:
    """Accumulate one forward's [layer][ubatch] {component: s} into the run's total."""
    for layer, ubatches in enumerate(step):
        if layer == len(total):
            total.append([])
        for ubatch, components in enumerate(ubatches):
            if ubatch == len(total[layer]):
                total[layer].append({})
            slot = total[layer][ubatch]
            for component, seconds in components.items():
                slot[component] = slot.get(component, 0.0) + seconds


def timings_document(per_ubatch: list[list[dict[str, float]]]) -> dict[str, Any]:
    """``RunOutputs.timings``: per layer {component: s} (ubatches summed) + the per-ubatch split."""
    layers = []
    for ubatches in per_ubatch:
        merged: dict[str, float] = {}
        for components in ubatches:
            for component, seconds in components.items():
                merged[component] = merged.get(component, 0.0) + seconds
        layers.append(dict(sorted(merged.items())))
    return {"unit": "s", "layers": layers, "ubatches": per_ubatch,
            "note": "in-process executor, summed over forward steps; perf_counter spans"}


def afd_step_fields(evidence: dict[str, Any]) -> dict[str, Any]:
    """A step's AFD-runtime evidence in full, plus its overlap summary at the top level."""
    return {"afd": evidence, **{k: evidence[k] for k in AFD_STEP_SUMMARY_KEYS if k in evidence}}
