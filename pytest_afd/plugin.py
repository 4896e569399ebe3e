"""pytest plugin entry point (registered through the ``pytest11`` entry point)."""

from __future__ import annotations

import pytest

MARKERS = {
    "gate": "an RFC correctness gate (run before merging a split-path change)",
    "stage_a": "RFC Stage A: split-policy validation",
    "stage_b": "RFC Stage B: prefix-cache hit ratio",
    "stage_c": "RFC Stage C: workload/request imbalance",
    "stage_d": "RFC Stage D: chunked prefill",
    "stage_e": "RFC Stage E: full layers and natural expert routing",
    "stage_f": "RFC Stage F: PP/dynamic CPP comparison (optional)",
    "slow": "slow test, deselected by the default run (select with -m slow)",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {help_text}")
