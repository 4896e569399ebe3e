"""Marker names and help texts, shared by the pytest plugin and the report.

The plugin registers them; the report titles its stage sections with them.
Living here (no pytest import) keeps the report from importing the plugin.
"""

from __future__ import annotations

from types import MappingProxyType

STAGE_MARKERS = ("stage_a", "stage_b", "stage_c", "stage_d", "stage_e", "stage_f")
MARKERS = MappingProxyType(
    {
        "gate": "an RFC correctness gate (run before merging a split-path change)",
        "stage_a": "RFC Stage A: split-policy validation",
        "stage_b": "RFC Stage B: prefix-cache hit ratio",
        "stage_c": "RFC Stage C: workload/request imbalance",
        "stage_d": "RFC Stage D: chunked prefill",
        "stage_e": "RFC Stage E: full layers and natural expert routing",
        "stage_f": "RFC Stage F: PP/dynamic CPP comparison (optional)",
        "slow": "slow test, deselected by the default run (select with -m slow)",
        "npu": "needs N local Ascend NPUs (of that SoC); skipped with the reason otherwise",
        "multi_node": "needs N nodes (AFD_NUM_NODES); skipped with the reason otherwise",
        "afd_deployments": "the server-side settings (deployments) the test runs, as override "
        "dicts or functions of a context (--afd-list-deployments; docs/plugin.md)",
    }
)
# Registered as "name(signature): help" so `pytest --markers` shows the arguments.
MARKER_SIGNATURES = MappingProxyType(
    {"npu": "npu(devices=N, soc=None)", "multi_node": "multi_node(nodes=N)",
     "afd_deployments": "afd_deployments(*overrides)"}
)
