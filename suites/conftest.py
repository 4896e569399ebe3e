"""Shared fixtures of the RFC stage suites (``suites/stage_a`` … ``suites/stage_f``).

Every stage measures the same way (the RFC's "reproducible benchmark harness"):
``warmups`` discarded runs per case, then ``>= 3`` measured repetitions in the
session's run order (interleaved by default, so drift hits every case alike),
headline metrics only from non-instrumented runs, and one extra instrumented
run per case only to explain (never for headline numbers). :class:`StageRunner`
implements that once on top of ``afd_options.repeat`` and writes one
schema-valid result per case through ``afd_results``. At the end of a session
that wrote stage results, the Markdown + PNG report is rendered into
``<results dir>/report/``.

Sizes: the RFC's logical sizes (8 requests, 65,536 prompt tokens, 128-token
KV blocks, 140,000 max batched tokens) are multiplied by the stage scale:
``--afd-stage-scale`` / ``$AFD_STAGE_SCALE`` / ini ``afd_stage_scale`` (a plugin
option: ``afd_options.stage_scale``), default 1/64 on the CPU backend
(so a stage runs in minutes) and 1 elsewhere (the real study).

Modules by job: ``stage_sizes`` (the scale), ``stage_backends`` (other models and
topologies), ``stage_cases`` (cases and measurements), ``stage_runner`` and
``stage_results`` (the protocol and its result JSON); this conftest holds the
hooks and fixtures.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from stage_backends import BackendHandle, BackendPool
from stage_cases import (
    StageCase,
    mean_step_time,
    missing_capabilities,
    required_capabilities,
)
from stage_runner import StageRunner, stage_settings
from stage_sizes import (
    StageSizes,
    power_of_two_at_most,
)

from pytest_afd.run import ab as afd_ab
from pytest_afd.run import ab_sides as afd_ab_sides
from pytest_afd.run import progress as afd_progress
from pytest_afd.run.options import parse_scale
from pytest_afd.run.session import afd_session
from pytest_afd.topology.spec import parse_topology

STAGE_KINDS = ("stage_a", "stage_b", "stage_c", "stage_d", "stage_e", "stage_f")


# --- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def stage_sizes(afd_options) -> StageSizes:
    """The stage scale (``--afd-stage-scale``, see ``afd_options``) and the recipe sizes at it."""
    return StageSizes(afd_options.stage_scale)


@pytest.fixture(scope="session")
def backend_pool(pytestconfig: pytest.Config, afd_backend, afd_manifest, afd_options, npu_topology):
    """The session backend plus backends for other models/topologies (closed at the end)."""
    pool = BackendPool(
        pytestconfig, BackendHandle(afd_backend, afd_manifest, npu_topology, afd_options.model)
    )
    yield pool
    pool.close()


@pytest.fixture
def stage_runner(request, backend_pool, afd_options, afd_results, stage_sizes) -> StageRunner:
    """The stage measurement protocol bound to this test's result writer and progress lines."""
    sides = afd_ab_sides.from_config(request.config)  # two deployments or code versions
    return StageRunner(
        handle=backend_pool.session,
        options=afd_options,
        writer=afd_results,
        sizes=stage_sizes,
        pool=backend_pool,
        progress=afd_progress.pytest_emitter(request.config),
        title=request.node.name,
        ab=afd_ab.parse(request.config.getoption("afd_ab", None)) or (
            None if sides is None else afd_ab.SAME_SETTINGS),
        ab_sides=sides,
    )


@pytest.fixture(scope="session")
def stage_helpers() -> SimpleNamespace:
    """This module's classes and pure helpers, for tests (conftest modules are not importable)."""
    return SimpleNamespace(
        BackendHandle=BackendHandle,
        StageCase=StageCase,
        StageRunner=StageRunner,
        StageSizes=StageSizes,
        mean_step_time=mean_step_time,
        missing_capabilities=missing_capabilities,
        parse_scale=parse_scale,
        power_of_two_at_most=power_of_two_at_most,
        required_capabilities=required_capabilities,
    )


# --- the deployments a stage test needs (--afd-list-deployments, deploy-command order) -----
DEPLOYMENTS_MARKER = "afd_deployments"


@pytest.hookimpl
def pytest_afd_deployment_settings(config: pytest.Config, item: pytest.Item) -> list | None:
    """The ``afd_deployments`` marker's settings at the stage scale (None: no marker).

    Each marker argument is a dict of :func:`stage_settings` overrides (plus
    optional ``model``, ``npu_topology`` and ``cases``: how many measured cases use
    it, for the listing's device-time estimate), or a function of a context
    (``sizes``, ``topology``, ``options``, ``item``) returning a list of them.
    """
    marker = item.get_closest_marker(DEPLOYMENTS_MARKER)
    if marker is None:
        return None
    options = afd_session(config).options
    sizes = StageSizes(options.stage_scale)
    context = SimpleNamespace(sizes=sizes, topology=options.topology, options=options, item=item)
    entries = []
    for argument in marker.args:
        for overrides in argument(context) if callable(argument) else [argument]:
            fields = dict(overrides)
            model = fields.pop("model", None)
            cases = fields.pop("cases", None)  # measured cases on it (the cost estimate)
            spec = fields.pop("npu_topology", None)
            topology = options.topology if spec is None else parse_topology(spec, options.aliases)
            entries.append({"settings": stage_settings(options, sizes, topology, **fields),
                            "npu_topology": topology.canonical, "model": model, "cases": cases})
    return entries


# --- the report at the end of a stage run --------------------------------------------------
_REPORT_KEY = pytest.StashKey[Path]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Render the report when this session wrote stage results (controller only under xdist)."""
    config = session.config
    if hasattr(config, "workerinput"):
        return
    state = afd_session(config)
    if not any(entry["case_kind"] in STAGE_KINDS for entry in state.written):
        return
    from pytest_afd.report import render  # matplotlib only when a report is due

    config.stash[_REPORT_KEY] = render(state.options.results_dir)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    report = config.stash.get(_REPORT_KEY, None)
    if report is not None:
        terminalreporter.write_line(f"pytest-afd stage report: {report}")
