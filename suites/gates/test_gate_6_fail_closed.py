"""Gate 6: unsupported combinations fail before communication resources are created.

Each unsupported attention builder, graph mode, speculative-metadata setting,
staging mode and topology goes through ``afd_split.checks.support.prepare_split_runtime``
with a group initialiser that really creates a ``torch.distributed`` process
group. The combination must raise ``UnsupportedSplitError`` naming the
offending value, the initialiser must never run, and afterwards no process
group may exist and no child process may have been started. A supported
combination through the same path does create the group, so the detector is
shown to see one.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import socket
from dataclasses import dataclass, field

import pytest
import torch.distributed as dist
from gate_lib import (
    SUPPORTED_CPU_TOPOLOGIES,
    gate_settings,
    record_gate_result,
    support_config_for,
)

from afd_split import UnsupportedSplitError
from afd_split.checks.support import prepare_split_runtime
from pytest_afd.topology.spec import parse_topology

LOOPBACK = "127.0.0.1"
GLOO_WORLD_SIZE = 1


@dataclass(frozen=True)
class Unsupported:
    name: str
    kind: str  # builder / graph_mode / speculative / staging (incl. policy) / topology
    expect: str  # a fragment the error must contain (names the offending value)
    overrides: dict = field(default_factory=dict)
    topology: str | None = None  # None: the session topology


CASES = (
    Unsupported("unknown_builder", "builder", "FlashAttentionMetadataBuilder",
                {"attention_builder": "FlashAttentionMetadataBuilder"}),
    Unsupported("mla_builder_token_split", "builder", "AscendMLAMetadataBuilder",
                {"attention_builder": "AscendMLAMetadataBuilder"}),
    Unsupported("graph_full", "graph_mode", "'full'", {"graph_mode": "full"}),
    Unsupported("graph_piecewise", "graph_mode", "'piecewise'", {"graph_mode": "piecewise"}),
    Unsupported("speculative_mtp1", "speculative", "num_speculative_tokens=1",
                {"num_speculative_tokens": 1}),
    Unsupported("speculative_3", "speculative", "num_speculative_tokens=3",
                {"num_speculative_tokens": 3}),
    Unsupported("three_stages", "staging", "num_stages=3", {"num_stages": 3}),
    Unsupported("gate_on_ffn_side", "staging", "compute_gate_on_attention",
                {"compute_gate_on_attention": False}),
    Unsupported("native_dbo", "staging", "DBO", {"native_dbo": True}),
    Unsupported("unknown_policy", "staging", "'three_way'", {"split_policy": "three_way"}),
    Unsupported("dcp4_afd", "topology", "dcp_size=4", topology="dp2dcp4tp4-ep8"),
    Unsupported("dcp2_colocated", "topology", "dcp_size=2", topology="dcp2tp2"),
    Unsupported("dcp2_with_graph", "topology", "dcp_size=2", {"graph_mode": "full"},
                topology="dp2dcp2pcp2-ep4"),
)  # fmt: skip


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


class GroupInitialiser:
    """What a deployment runs once the split is allowed: create its process group."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{LOOPBACK}:{free_port()}",
            rank=0,
            world_size=GLOO_WORLD_SIZE,
        )
        return "group"


@pytest.fixture
def no_group_before():
    assert not dist.is_initialized(), "a process group already exists: the check would be blind"
    children = set(multiprocessing.active_children())
    yield children
    if dist.is_initialized():  # leave the process clean even when a check failed
        dist.destroy_process_group()


@pytest.mark.gate
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gate_6_unsupported_fails_before_communication(
    case, no_group_before, gate_pages, gate_backends, afd_options, afd_results
):
    topology = parse_topology(case.topology or afd_options.topology.canonical, afd_options.aliases)
    config = support_config_for(topology, afd_options.backend, **case.overrides)
    initialiser = GroupInitialiser()
    error = None
    try:
        prepare_split_runtime(config, initialiser)
    except UnsupportedSplitError as raised:
        error = str(raised)
    group_exists = dist.is_initialized()
    new_children = set(multiprocessing.active_children()) - no_group_before
    record_gate_result(
        afd_results,
        manifest=gate_backends.manifest(topology.canonical, backend=False),
        settings=gate_settings(topology, gate_pages),
        topology=topology,
        prompts=[],
        outputs=None,
        dataset=f"gate6/{case.kind}",
        seed=None,
        gate={
            "gate": 6,
            "case": case.name,
            "kind": case.kind,
            "support_config": {k: str(v) for k, v in dataclasses.asdict(config).items()},
            "error": error,
            "group_initialiser_calls": initialiser.calls,
            "process_group_initialised": group_exists,
            "child_processes_started": len(new_children),
        },
    )
    assert error is not None, f"{case.name}: {config} was accepted"
    assert case.expect in error, f"{case.name}: the error does not name {case.expect!r}: {error}"
    assert initialiser.calls == 0, "the process group initialiser ran for an unsupported config"
    assert not group_exists, "a torch.distributed process group was initialised"
    assert not new_children, f"child processes were started: {new_children}"


@pytest.mark.gate
@pytest.mark.parametrize("spec", SUPPORTED_CPU_TOPOLOGIES)
def test_gate_6_supported_topology_reaches_the_group(spec, no_group_before, afd_options):
    """Control: the same path creates a real group for a supported combination."""
    config = support_config_for(parse_topology(spec), afd_options.backend)
    initialiser = GroupInitialiser()
    assert prepare_split_runtime(config, initialiser) == "group"
    assert initialiser.calls == 1 and dist.is_initialized()
    dist.destroy_process_group()
    assert not dist.is_initialized()
