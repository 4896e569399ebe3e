"""Gate-local fixtures: the topology sweep, per-topology backends (helpers live in gate_lib)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gate_case import GateCase, LiveReferences
from gate_lib import (
    CPU_BACKEND,
    SUPPORTED_CPU_TOPOLOGIES,
    GateBackends,
    PageScale,
    afd_topology_specs,
    gate_quantization_cases,
    gate_topology_specs,
    page_scale,
    support_config_for,
)
from gate_reference import GateReferences

from afd_split.checks.support import unsupported_reasons
from pytest_afd.core.backend import Backend, CapabilityMissing
from pytest_afd.faults.registry import applied_from_env
from pytest_afd.golden.reference_phase import reference_phase
from pytest_afd.golden.store import GoldenStore
from pytest_afd.results.documents import validate_manifest
from pytest_afd.results.manifest import collect_manifest, manifest_digest
from pytest_afd.run.options import AfdOptions
from pytest_afd.run.session import afd_session, is_worker
from pytest_afd.run.xdist_order import long_cases_first
from pytest_afd.topology.spec import Topology, parse_topology

LONG_GATE_CASES = (
    "test_gate_5_soak_mixed_partial_splits",
    "test_gate_5_memory_bound_sees_a_leak_no_reference_shows",
    "test_gate_4_full_natural_greedy_tokens_match_unsplit",
)
"""The gates' longest cases (~7, ~2.5 and 1-2 s each on 2 cores): first under xdist."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist the longest gate cases run first (``xdist_order``)."""
    if is_worker(config):
        items[:] = long_cases_first(items, LONG_GATE_CASES)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``gate_topology`` over the supported topologies (with ``gate_quantization``: the pairs
    of :func:`gate_lib.gate_quantization_cases`); ``gate_afd_topology`` over the AFD ones."""
    if "gate_afd_topology" in metafunc.fixturenames:
        options = afd_session(metafunc.config).options
        specs = afd_topology_specs(options)
        cases = specs or [pytest.param(None, id="no-cpu-afd-runtime", marks=pytest.mark.skip(
            reason=f"the Attention/FFN process-pair runtime is the CPU backend's; backend "
                   f"{options.backend!r} runs its own AFD deployment, which "
                   "test_gate_1_token_balanced_matches_unsplit covers through Backend.run"))]
        metafunc.parametrize("gate_afd_topology", cases, ids=specs or None, scope="session")
    if "gate_topology" not in metafunc.fixturenames:
        return
    specs = gate_topology_specs(afd_session(metafunc.config).options)
    if "gate_quantization" in metafunc.fixturenames:
        cases = gate_quantization_cases(specs)
        metafunc.parametrize(
            ("gate_topology", "gate_quantization"),
            cases,
            ids=[f"{spec}-{quant}" for spec, quant in cases],
            scope="session",
        )
    else:
        metafunc.parametrize("gate_topology", specs, ids=specs, scope="session")


@pytest.fixture(scope="session", autouse=True)
def seeded_fault() -> Iterator[str | None]:
    """The split-path fault ``$PYTEST_AFD_FAULT`` names, applied for the whole gate session.

    The mutation check (``pytest-afd fault-check``) sets it and
    expects ``pytest -m gate`` to fail; unset, nothing is patched.
    """
    with applied_from_env() as fault:
        yield None if fault is None else fault.name


@pytest.fixture(scope="session")
def gate_backends(
    afd_options: AfdOptions, request: pytest.FixtureRequest
) -> Iterator[GateBackends]:
    """Backends by (topology, model), created on first use and closed at the end."""

    def make_manifest(backend: Backend | None, topology: Topology, model: str) -> dict:
        manifest = collect_manifest(
            topology=topology,
            backend_name=afd_options.backend,
            backend_description=None if backend is None else backend.describe(),
            backend_absent_reason="this case runs no backend" if backend is None else None,
            model_name=model,
            protocol=afd_options.protocol(),
            emulated=afd_options.backend == CPU_BACKEND,
            devices_per_node=afd_options.devices_per_node,
        )
        request.config.hook.pytest_afd_manifest(config=request.config, manifest=manifest)
        manifest["digest"] = manifest_digest(manifest)
        validate_manifest(manifest)
        return manifest

    backends = GateBackends(
        afd_options,
        lambda: request.getfixturevalue("afd_backend"),
        make_manifest,
        lambda: request.getfixturevalue("afd_manifest"),
    )
    yield backends
    backends.close()


@pytest.fixture(scope="session")
def gate_pages(afd_options: AfdOptions) -> PageScale:
    """The KV page the gates run with and the factor on their token counts."""
    return page_scale(afd_options.backend)


@pytest.fixture
def gate_topology_obj(gate_topology: str, afd_options: AfdOptions) -> Topology:
    """This case's topology; it must pass the split path's fail-closed support check.

    A listed CPU topology that is rejected is a failure; a session
    ``--npu-topology`` the split path does not support is skipped (gate 6 is
    about rejecting it).
    """
    topology = parse_topology(gate_topology, afd_options.aliases)
    reasons = unsupported_reasons(support_config_for(topology, afd_options.backend))
    if reasons and topology.canonical not in SUPPORTED_CPU_TOPOLOGIES:
        pytest.skip(f"the split path does not support {gate_topology}: {'; '.join(reasons)}")
    assert not reasons, (
        f"{gate_topology} is listed as supported but the split path rejects it: {reasons}"
    )
    return topology


@pytest.fixture
def gate_manifest(gate_backends: GateBackends, gate_topology: str) -> dict:
    """The manifest of this case's backend: its own topology and model."""
    return gate_backends.manifest(gate_topology)


@pytest.fixture
def gate_backend(gate_backends: GateBackends, gate_topology: str) -> Backend:
    """The backend for this case's topology, with a cold prefix cache."""
    backend = gate_backends.get(gate_topology)
    backend.reset_prefix_cache()
    return backend


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """A case the deployment cannot run (another split, chunking, ...) is a skip with the reason."""
    try:
        return (yield)
    except CapabilityMissing as error:
        pytest.skip(f"the backend cannot run this case: {error}")


@pytest.fixture
def gate_references(
    pytestconfig: pytest.Config, golden: GoldenStore, afd_options: AfdOptions
) -> GateReferences:
    """``--afd-reference-phase`` (live, record or check) bound to the golden store."""
    return GateReferences(reference_phase(pytestconfig), golden, afd_options.model,
                          afd_options.backend)


@pytest.fixture(scope="session")
def gate_live_references() -> LiveReferences:
    """Live reference runs shared by the cases that compare against the same one."""
    return LiveReferences()


@pytest.fixture
def gate_case(afd_results, gate_references: GateReferences, golden: GoldenStore,
              afd_options: AfdOptions, gate_live_references: LiveReferences) -> GateCase:
    """The comparison protocol every gate case runs (``gate_case.GateCase``)."""
    return GateCase(afd_results, gate_references, golden, afd_options.seed,
                    gate_live_references)
