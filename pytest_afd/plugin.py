"""pytest plugin entry point (registered through the ``pytest11`` entry point).

Options (group ``afd``, defined in :mod:`pytest_afd.options`), markers, fixtures (``npu_topology``, ``rank_layout``,
``afd_backend``, ``afd_options``, ``afd_manifest``, ``golden``,
``afd_results``), hardware-marker skips, per-worker result collection merged
under pytest-xdist, and the terminal summary. See ``docs/plugin.md``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_afd import hardware, hookspecs, outcomes, reference_phase, verdicts
from pytest_afd.backends import create_backend
from pytest_afd.backends.base import Backend, BackendUnavailable
from pytest_afd.golden import GoldenStore
from pytest_afd.manifest import collect_manifest, manifest_digest
from pytest_afd.markers import MARKER_SIGNATURES, MARKERS, STAGE_MARKERS
from pytest_afd.options import (  # noqa: F401  (AfdOptions and the defaults are re-exported)
    DEFAULT_GOLDEN_DIR,
    DEFAULT_RESULTS_DIR,
    OPTION_SPECS,
    AfdOptions,
    add_options,
    resolve_options,
)
from pytest_afd.results import (
    CASE_KINDS,
    ResultValidationError,
    build_result,
    headline,
    result_path,
    validate_manifest,
    write_result,
)
from pytest_afd.results_dir import remove_stale_temp_files, results_written_since
from pytest_afd.topology import RankInfo, Topology

SUMMARY_FILE = "summary.json"
WORKEROUTPUT_KEY = "afd_results"
AFD_SESSION_PLUGIN = "afd-session"
ENV_NUM_NODES = "AFD_NUM_NODES"
DEFAULT_NUM_NODES = 1
# Marker defaults: npu() alone means one NPU, multi_node() alone means two nodes.
DEFAULT_NPU_DEVICES = 1
DEFAULT_MULTI_NODE_NODES = 2


@dataclass(eq=False)  # identity-hashed: it is registered as a pytest plugin
class AfdSession:
    """Per-process plugin state (one per xdist worker), kept in ``config.stash``."""

    config: pytest.Config
    options: AfdOptions
    backend_instance: Backend | None = None
    backend_error: BackendUnavailable | None = None
    backend_tried: bool = False
    manifest_doc: dict[str, Any] | None = None
    written: list[dict[str, Any]] = field(default_factory=list)
    golden_updates: list[str] = field(default_factory=list)
    # Controller side under xdist: workers that died before handing back their results.
    lost_workers: list[dict[str, str]] = field(default_factory=list)
    # Temp files of killed atomic writes removed at start-up (controller only).
    stale_temp_removed: list[Path] = field(default_factory=list)
    # Result files modified since then belong to this session (lost-worker recovery).
    started_at: float = field(default_factory=time.time)
    # Test outcome per node id (controller side under xdist: it sees every report).
    outcomes: dict[str, str] = field(default_factory=dict)

    @property
    def emulated(self) -> bool:
        return self.options.backend == "cpu"

    def backend(self) -> Backend:
        """Create the backend once per process; re-raise BackendUnavailable on every call."""
        if not self.backend_tried:
            opts = self.options
            try:
                backend = self.config.hook.pytest_afd_create_backend(
                    config=self.config,
                    name=opts.backend,
                    topology=opts.topology,
                    model_name=opts.model,
                    seed=opts.seed,
                    results_dir=opts.results_dir,
                )
                self.backend_instance = backend or create_backend(
                    opts.backend,
                    topology=opts.topology,
                    model_name=opts.model,
                    seed=opts.seed,
                    results_dir=opts.results_dir,
                )
            except BackendUnavailable as exc:
                self.backend_error = exc
            # Any other error propagates and the next caller tries again.
            self.backend_tried = True
        if self.backend_error is not None:
            raise self.backend_error
        return self.backend_instance

    def manifest(self) -> dict[str, Any]:
        if self.manifest_doc is None:
            description, reason = None, None
            try:
                description = self.backend().describe()
            except BackendUnavailable as exc:
                reason = f"backend {self.options.backend!r} unavailable: {exc}"
            manifest = collect_manifest(
                topology=self.options.topology,
                backend_name=self.options.backend,
                backend_description=description,
                backend_absent_reason=reason,
                model_name=self.options.model,
                protocol=self.options.protocol(),
                emulated=self.emulated,
                devices_per_node=self.options.devices_per_node,
            )
            self.config.hook.pytest_afd_manifest(config=self.config, manifest=manifest)
            manifest["digest"] = manifest_digest(manifest)
            validate_manifest(manifest)
            self.manifest_doc = manifest
        return self.manifest_doc

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Remember each test's outcome for the results table (setup/teardown failure = error)."""
        if report.when == "call":
            self.outcomes[report.nodeid] = report.outcome
        elif report.failed:
            self.outcomes[report.nodeid] = "error"

    def close(self) -> None:
        if self.backend_instance is not None:
            backend, self.backend_instance = self.backend_instance, None
            backend.close()


AFD_SESSION_KEY = pytest.StashKey[AfdSession]()


def afd_session(config: pytest.Config) -> AfdSession:
    return config.stash[AFD_SESSION_KEY]


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    reference_phase.add_option(add_options(parser), parser)


def pytest_configure(config: pytest.Config) -> None:
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", f"{MARKER_SIGNATURES.get(name, name)}: {help_text}")
    state = AfdSession(config=config, options=resolve_options(config))
    config.stash[AFD_SESSION_KEY] = state
    if not _is_worker(config):  # workers start while the controller's session runs
        for directory in (state.options.results_dir, state.options.golden_dir):
            state.stale_temp_removed += remove_stale_temp_files(directory)
    # Registered as a plugin so it receives every test report (outcome column).
    config.pluginmanager.register(state, AFD_SESSION_PLUGIN)
    outcomes.register(config)
    reference_phase.reference_phase(config)  # a bad value is a UsageError now, not per test
    ledger = hardware.HardwareLedger(state.options.backend, state.options.require_hardware,
                                     lambda: state.backend_instance)
    config.pluginmanager.register(ledger, hardware.PLUGIN_NAME)


def pytest_report_header(config: pytest.Config) -> list[str]:
    state = afd_session(config)
    opts = state.options
    topo = opts.topology
    roles = (
        f"{topo.attention_ranks} Attention + {topo.ffn_ranks} FFN ranks, ratio {topo.ratio_label}"
        if topo.is_afd
        else f"{topo.attention_ranks} co-located ranks"
    )
    lines = [
        f"afd: backend={opts.backend} topology={topo.canonical} ({roles}, "
        f"{topo.nodes_needed(opts.devices_per_node)} nodes of {opts.devices_per_node}) "
        f"model={opts.model} routing={opts.routing} seed={opts.seed} repeats={opts.repeats} "
        f"warmups={opts.warmups} order={opts.run_order}"
    ]
    if state.stale_temp_removed:
        lines.append(
            f"afd: removed {len(state.stale_temp_removed)} stale temp file(s) of killed writes "
            f"({', '.join(sorted({str(path.parent) for path in state.stale_temp_removed}))})"
        )
    if opts.backend == "cpu":
        lines.append(f"afd: CPU emulation: {topo.cpu_emulation().note}")
    return lines


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


def _hardware_skip_reason(item: pytest.Item) -> str | None:
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


def pytest_runtest_setup(item: pytest.Item) -> None:
    opts = afd_session(item.config).options
    reason = _hardware_skip_reason(item)
    if reason is None:
        return
    if opts.require_hardware:
        pytest.fail(f"--afd-require-hardware: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def afd_options(pytestconfig: pytest.Config) -> AfdOptions:
    """Resolved ``--afd-*`` options: ``run_settings(**overrides)``, ``repeat(cases)``, ``protocol()``."""
    return afd_session(pytestconfig).options


@pytest.fixture(scope="session")
def npu_topology(afd_options: AfdOptions) -> Topology:
    """The parsed ``--npu-topology`` (default ``dp3pcp8-ep8``)."""
    return afd_options.topology


@pytest.fixture(scope="session")
def rank_layout(npu_topology: Topology, afd_options: AfdOptions) -> list[RankInfo]:
    """Rank → node, device, role and DP/PCP/PP/group/EP indices."""
    return npu_topology.rank_layout(afd_options.devices_per_node)


@pytest.fixture(scope="session")
def afd_backend(pytestconfig: pytest.Config) -> Backend:
    """The session's backend; unavailable → skip with the reason (fail under --afd-require-hardware)."""
    state = afd_session(pytestconfig)
    try:
        return state.backend()
    except BackendUnavailable as exc:
        message = f"backend {state.options.backend!r} unavailable: {exc}"
        if state.options.require_hardware:
            pytest.fail(f"--afd-require-hardware: {message}", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def afd_manifest(pytestconfig: pytest.Config) -> dict[str, Any]:
    """The session manifest (validated, with ``digest``)."""
    return afd_session(pytestconfig).manifest()


@pytest.fixture
def golden(pytestconfig: pytest.Config) -> GoldenStore:
    """``golden.check(name, value, profile=..., reference=None)`` against ``--afd-golden-dir``."""
    state = afd_session(pytestconfig)
    store = GoldenStore(
        directory=state.options.golden_dir,
        update=state.options.update_golden,
        manifest_digest=lambda: state.manifest()["digest"],
    )
    yield store
    state.golden_updates.extend(store.updated)


def case_kind(item: pytest.Item) -> str:
    """The first gate/stage marker on the test, else ``"other"``."""
    for kind in CASE_KINDS:
        if item.get_closest_marker(kind) is not None:
            return kind
    return "other"


def summary_entry(doc: dict[str, Any], nodeid: str, path: Path) -> dict[str, Any]:
    """One row of summary.json and of the terminal table for a written result."""
    metric, median, cv, unit = headline(doc)
    return {
        "case_id": doc["case_id"],
        "nodeid": nodeid,
        "case_kind": doc["case_kind"],
        "path": str(path),
        "metric": metric,
        "median": median,
        "cv": cv,
        "unit": unit,
        "synthetic": doc["labels"]["synthetic"],
        "comparability": doc["labels"]["comparability"],
        "manifest_digest": doc["manifest_digest"],
    }


def _recover_lost_results(state: AfdSession) -> None:
    """Results a dead worker wrote this session, read back from the results dir."""
    listed = {entry["case_id"] for entry in state.written}
    for path, doc in results_written_since(state.options.results_dir, state.started_at):
        if doc["case_id"] in listed:
            continue
        owners = [nodeid for nodeid in state.outcomes if doc["case_id"].startswith(nodeid)]
        entry = summary_entry(doc, max(owners, key=len, default=doc["case_id"]), path)
        state.written.append({**entry, "recovered": True})


@dataclass
class ResultWriter:
    """The ``afd_results`` fixture: one validated, atomically written result JSON per case."""

    state: AfdSession
    case_id: str
    case_kind: str
    written: list[str] = field(default_factory=list)

    @property
    def results_dir(self) -> Path:
        return self.state.options.results_dir

    def build(self, *, case_suffix: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """:func:`pytest_afd.results.build_result` with case id, kind, backend, protocol and manifest filled in."""
        opts = self.state.options
        defaults = {
            "case_id": self.case_id if case_suffix is None else f"{self.case_id}/{case_suffix}",
            "case_kind": self.case_kind,
            "backend": opts.backend,
            "protocol": {
                k: v
                for k, v in opts.protocol().items()
                if k in ("seed", "warmups", "repetitions", "run_order")
            },
        }
        if "manifest" not in kwargs:
            defaults["manifest"] = self.state.manifest()
        return build_result(**{**defaults, **kwargs})

    def write(self, doc: dict[str, Any]) -> Path:
        """Validate and write ``doc``; an invalid result fails the test with the validation error."""
        if doc.get("case_id") in self.written:
            pytest.fail(
                f"result {doc['case_id']!r} written twice: one result per case", pytrace=False
            )
        path = result_path(self.results_dir, str(doc.get("case_id", self.case_id)))
        doc = outcomes.tracker(self.state.config).stamp(doc)
        try:
            write_result(path, doc)
        except ResultValidationError as exc:
            pytest.fail(str(exc), pytrace=False)
        self.written.append(doc["case_id"])
        self.state.written.append(summary_entry(doc, self.case_id, path))
        self.state.config.hook.pytest_afd_result_written(
            config=self.state.config, path=path, result=doc
        )
        return path

    def record(self, **kwargs: Any) -> Path:
        """Build (see :meth:`build`) and write in one call."""
        return self.write(self.build(**kwargs))


@pytest.fixture
def afd_results(request: pytest.FixtureRequest) -> ResultWriter:
    """Writer for this case's result JSON (``record(...)``, or ``build(...)`` then ``write(doc)``)."""
    return ResultWriter(
        state=afd_session(request.config),
        case_id=request.node.nodeid,
        case_kind=case_kind(request.node),
    )


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = afd_session(session.config)
    state.close()
    if _is_worker(session.config):
        session.config.workeroutput[WORKEROUTPUT_KEY] = {
            "results": state.written,
            "golden_updates": state.golden_updates,
        }
        return
    if state.lost_workers:
        _recover_lost_results(state)
    ledger = session.config.pluginmanager.get_plugin(hardware.PLUGIN_NAME)
    measured = ledger.summary() if ledger is not None else None
    extra: dict[str, Any] = {}
    if state.lost_workers:
        extra["lost_workers"] = state.lost_workers
    if measured is not None:
        extra[hardware.SUMMARY_KEY] = measured
    outcomes.tracker(session.config).write_summary(
        state.options.results_dir / SUMMARY_FILE, state.written, state.options.results_dir,
        state.golden_updates, extra=extra,
    )


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist: merge a finished worker's results into the controller's summary.

    A worker that died (``error`` set) never sends ``workeroutput``: xdist reports
    its running test as failed, the other workers' results are kept, and the
    summary lists the lost worker (its result files stay on disk).
    """
    state = afd_session(node.config)
    if error is not None:
        state.lost_workers.append({"worker": str(node.gateway.id), "error": str(error)})
        return
    output = node.workeroutput.get(WORKEROUTPUT_KEY)
    if output is None:
        return
    state.written.extend(output["results"])
    state.golden_updates.extend(output["golden_updates"])


def _format_value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = afd_session(config)
    if _is_worker(config) or not (state.written or state.golden_updates or state.lost_workers):
        return
    reporter = terminalreporter
    reporter.section("pytest-afd results")
    rows = [
        (
            entry["case_id"],
            entry["case_kind"],
            state.outcomes.get(entry["nodeid"], "unknown"),
            f"{entry['metric']} {_format_value(entry['median'])} {entry['unit']}".strip(),
            _format_value(entry["cv"]),
            ",".join(
                label
                for label, on in (
                    ("synthetic", entry["synthetic"]),
                    ("exploratory", entry["comparability"] == "exploratory"),
                )
                if on
            )
            or "-",
        )
        for entry in sorted(state.written, key=lambda e: e["case_id"])
    ]
    header = ("case", "kind", "outcome", "headline (median)", "CV", "labels")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        reporter.write_line(
            "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        )
    if state.written:
        reporter.write_line(
            f"{len(state.written)} result JSON file(s) in {state.options.results_dir} "
            f"(summary: {state.options.results_dir / SUMMARY_FILE})"
        )
        reporter.write_line("verdicts (python -m pytest_afd report for the full report):")
        paths = [entry["path"] for entry in state.written]
        for line in verdicts.summary_lines_from_files(paths, STAGE_MARKERS):
            reporter.write_line(f"  {line}")
    for lost in state.lost_workers:
        reporter.write_line(
            f"worker {lost['worker']} crashed ({lost['error']}): the results it wrote this "
            f"session were read back from {state.options.results_dir} (marked recovered)"
        )
    if state.golden_updates:
        reporter.write_line(
            f"{len(state.golden_updates)} golden(s) updated in {state.options.golden_dir}"
        )
