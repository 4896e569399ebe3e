"""pytest plugin entry point (registered through the ``pytest11`` entry point).

Options (group ``afd``, defined in :mod:`pytest_afd.run.options`), markers, fixtures (``npu_topology``, ``rank_layout``,
``afd_backend``, ``afd_options``, ``afd_manifest``, ``golden``,
``afd_results``), hardware-marker skips, per-worker result collection merged
under pytest-xdist, and the terminal summary. See ``docs/plugin.md``.

Modules by job: :mod:`pytest_afd.run.session` (per-process state),
:mod:`pytest_afd.run.hardware_markers` (marker skips), :mod:`pytest_afd.run.result_writer`
(the ``afd_results`` writer), :mod:`pytest_afd.run.terminal` (the results table).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from afd_split.hook.planning.worker_evidence import EvidenceSettings
from pytest_afd.core import hookspecs
from pytest_afd.core.backend import Backend, BackendUnavailable
from pytest_afd.core.markers import MARKER_SIGNATURES, MARKERS
from pytest_afd.golden import reference_phase
from pytest_afd.golden.store import RECORD_PHASE_COMMAND, UPDATE_GOLDEN_COMMAND, GoldenStore
from pytest_afd.results import profile_ledger
from pytest_afd.results.directory import remove_stale_temp_files
from pytest_afd.results.shared import SessionLease
from pytest_afd.run import (
    ab,
    ab_sides,
    deployment_plan,
    early_setup,
    gate_runs,
    hardware,
    interrupted,
    outcomes,
)
from pytest_afd.run.hardware_markers import hardware_skip_reason
from pytest_afd.run.option_specs import value_flags
from pytest_afd.run.options import (  # noqa: F401  (AfdOptions and the defaults are re-exported)
    DEFAULT_GOLDEN_DIR,
    DEFAULT_RESULTS_DIR,
    OPTION_SPECS,
    AfdOptions,
    add_options,
    resolve_options,
)
from pytest_afd.run.result_writer import ResultWriter, case_kind, recover_lost_results
from pytest_afd.run.session import (
    AFD_SESSION_KEY,
    EXIT_BACKEND_UNAVAILABLE,
    AfdSession,
    afd_session,
    is_worker,
    write_error,
)
from pytest_afd.run.terminal import (
    FinalLine,
    write_no_case_selected,
    write_results_table,
    write_write_errors,
)
from pytest_afd.topology.spec import RankInfo, Topology, afd_suggestion

SUMMARY_FILE = "summary.json"
WORKEROUTPUT_KEY = "afd_results"
AFD_SESSION_PLUGIN = "afd-session"
FINAL_LINE_PLUGIN = "afd-final-line"
EXIT_RESULTS_UNWRITABLE = 6
"""Exit status of a session whose results or summary could not be written (a full disk):
distinct from pytest's own 0-5, so CI tells "tests failed" from "the record is incomplete"."""


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = add_options(parser)
    reference_phase.add_option(group, parser)
    deployment_plan.add_option(group)
    ab.add_option(group)
    ab_sides.add_options(group)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, args: list[str]) -> None:
    """Before any conftest: undo a rootdir that a space-separated option value moved."""
    early_setup.repair_setup(early_config, args, value_flags(
        (reference_phase.FLAG, ab_sides.PYTHON_FLAG, ab_sides.CHECKOUT_FLAG)))


def pytest_configure(config: pytest.Config) -> None:
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", f"{MARKER_SIGNATURES.get(name, name)}: {help_text}")
    state = AfdSession(config=config, options=resolve_options(config))
    config.stash[AFD_SESSION_KEY] = state
    # Workers start while the controller's session runs; --co writes (and deletes) nothing.
    if not is_worker(config) and not config.option.collectonly:
        for directory in (state.options.results_dir, state.options.golden_dir):
            state.stale_temp_removed += remove_stale_temp_files(directory)
    # Registered as a plugin so it receives every test report (outcome column).
    config.pluginmanager.register(state, AFD_SESSION_PLUGIN)
    outcomes.register(config)
    try:  # AFD_EVIDENCE_DIR / AFD_EVIDENCE_MAX_BYTES: refused once here, not in every case
        EvidenceSettings.from_env(os.environ)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    reference_phase.reference_phase(config)  # a bad value is a UsageError now, not per test
    try:  # --afd-ab A B: refused once here, naming the bad field
        ab.parse(config.getoption("afd_ab", None))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    ab_sides.configure(config, state.options.backend)  # two deployments / code versions
    ledger = hardware.HardwareLedger(state.options.backend, state.options.require_hardware,
                                     lambda: [state.backend_instance, *state.other_backends],
                                     allow_emulated=state.options.allow_emulated,
                                     phase=reference_phase.reference_phase(config),
                                     golden_dir=state.options.golden_dir)
    config.pluginmanager.register(ledger, hardware.PLUGIN_NAME)
    interrupted.register(config)
    gate_runs.register(config, require_hardware=state.options.require_hardware,
                       exempt_phase=reference_phase.reference_phase(config) == reference_phase.PHASE_RECORD,
                       measured=lambda: ledger.measured, hardware_backend=ledger.applies)
    if not is_worker(config):
        config.pluginmanager.register(FinalLine(state), FINAL_LINE_PLUGIN)
    config.pluginmanager.register(deployment_plan, deployment_plan.PLUGIN_NAME)
    if state.options.study is not None:  # --afd-study: record it, refuse contradicting runs
        from pytest_afd.run.study_plugin import PLUGIN_NAME, StudyPlugin

        config.pluginmanager.register(StudyPlugin(state.options.study), PLUGIN_NAME)


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
        f"{devices_phrase(topo, opts.given_devices_per_node())}) "
        f"model={opts.model} routing={opts.routing} seed={opts.seed} repeats={opts.repeats} "
        f"warmups={opts.warmups} order={opts.run_order}"
    ]
    note = topology_note(opts)
    if note is not None:
        lines.append(note)
    if state.stale_temp_removed:
        lines.append(
            f"afd: removed {len(state.stale_temp_removed)} stale temp file(s) of killed writes "
            f"({', '.join(sorted({str(path.parent) for path in state.stale_temp_removed}))})"
        )
    if opts.backend == "cpu":
        lines.append(f"afd: CPU emulation: {topo.cpu_emulation().note}")
    return lines


def devices_phrase(topo: Topology, devices_per_node: int | None) -> str:
    """``N nodes of D`` when the user gave the devices per node, else the device count
    alone: the node count of a default would misstate a 2 x 16 recipe as 4 x 8."""
    if devices_per_node is None:
        return (f"{topo.devices_needed} devices; devices per node not given "
                "(--afd-devices-per-node)")
    return f"{topo.nodes_needed(devices_per_node)} nodes of {devices_per_node}"


def topology_note(opts: AfdOptions) -> str | None:
    """The "did you mean" warning of a co-located topology one dash from an AFD layout."""
    suggestion = afd_suggestion(opts.topology, opts.aliases)
    if suggestion is None:
        return None
    return (f"afd: WARNING: --npu-topology {opts.topology_spec!r} is a co-located (non-AFD) "
            f"layout; did you mean {suggestion} (Attention and FFN on their own ranks)?")


def pytest_runtest_setup(item: pytest.Item) -> None:
    opts = afd_session(item.config).options
    reason = hardware_skip_reason(item)
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
    """The session's backend; unavailable → skip with the reason (under --afd-require-hardware
    the session stops once, exit status ``EXIT_BACKEND_UNAVAILABLE``)."""
    state = afd_session(pytestconfig)
    try:
        return state.backend()
    except BackendUnavailable as exc:
        message = f"backend {state.options.backend!r} unavailable: {exc}"
        if state.options.require_hardware:
            pytest.exit(f"pytest-afd: --afd-require-hardware: {message}",
                        returncode=EXIT_BACKEND_UNAVAILABLE)
        pytest.skip(message)


@pytest.fixture(scope="session")
def afd_manifest(pytestconfig: pytest.Config) -> dict[str, Any]:
    """The session manifest (validated, with ``digest``)."""
    return afd_session(pytestconfig).manifest()


@pytest.fixture
def golden(pytestconfig: pytest.Config) -> GoldenStore:
    """``golden.check(name, value, profile=..., reference=None)`` against ``--afd-golden-dir``."""
    state = afd_session(pytestconfig)
    checking = reference_phase.reference_phase(pytestconfig) == reference_phase.PHASE_CHECK
    store = GoldenStore(
        directory=state.options.golden_dir,
        update=state.options.update_golden,
        manifest=state.manifest,  # recorded in each sidecar, compared field by field
        record_with=RECORD_PHASE_COMMAND if checking else UPDATE_GOLDEN_COMMAND,
    )
    yield store
    state.golden_updates.extend(store.updated)


@pytest.fixture
def afd_results(request: pytest.FixtureRequest) -> ResultWriter:
    """Writer for this case's result JSON (``record(...)``, or ``build(...)`` then ``write(doc)``)."""
    return ResultWriter(
        state=afd_session(request.config),
        case_id=request.node.nodeid,
        case_kind=case_kind(request.node),
    )


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """The controller claims the results dir for the session (not for --help, nor --co,
    which runs nothing and writes nothing)."""
    config = session.config
    if is_worker(config) or config.option.collectonly:
        return
    state = afd_session(config)
    try:
        state.lease = SessionLease(state.options.results_dir,
                                   outcomes.tracker(config).session_id).acquire()
    except OSError as exc:
        raise pytest.UsageError(write_error(
            state.options.results_dir, exc, "the session cannot claim it")) from None


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(AFD_SESSION_KEY, None)
    if state is not None and state.lease is not None:
        state.lease.release()


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = afd_session(session.config)
    state.close()
    if session.config.option.collectonly or session.config.getoption(deployment_plan.DEST):
        return  # --co and --afd-list-deployments run nothing: the last summary stays
    if is_worker(session.config):
        session.config.workeroutput[WORKEROUTPUT_KEY] = {
            "results": state.written,
            "golden_updates": state.golden_updates,
            "write_errors": state.write_errors,
        }
        return
    stopped = interrupted_block(session.config)
    if state.selected_no_case and stopped is None:  # `-m gates` (a typo): the summary stays
        return
    if state.lost_workers:
        recover_lost_results(state)
    ledger = session.config.pluginmanager.get_plugin(hardware.PLUGIN_NAME)
    measured = ledger.summary() if ledger is not None else None
    extra: dict[str, Any] = {}
    if state.lost_workers:
        extra["lost_workers"] = state.lost_workers
    if measured is not None:
        extra[hardware.SUMMARY_KEY] = measured
    if stopped is not None:
        extra[interrupted.SUMMARY_KEY] = stopped
    gates = gate_runs.ledger_of(session.config)
    if gates is not None and gates.summary() is not None:
        extra[gate_runs.SUMMARY_KEY] = gates.summary()
    profiles = profile_ledger.count_entries(state.written)
    if profiles.instrumented or state.options.profile:
        extra[profile_ledger.SUMMARY_KEY] = profiles.summary(state.options.profile)
    if profiles.fails(state.options.profile) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # asked for profiles, got none
    summary_path = state.options.results_dir / SUMMARY_FILE
    try:
        outcomes.tracker(session.config).write_summary(
            summary_path, state.written, state.options.results_dir,
            state.golden_updates, extra=extra,
        )
    except OSError as exc:  # a full disk: say so, keep pytest's own summary, exit distinctly
        state.write_errors.append(write_error(summary_path, exc, "no summary was written"))
    if state.write_errors:
        session.exitstatus = EXIT_RESULTS_UNWRITABLE


def interrupted_block(config: pytest.Config) -> dict[str, Any] | None:
    """An interrupted session's ``summary.json`` entry (None otherwise); the running case's
    written results are stamped with the interruption (once)."""
    ledger = interrupted.ledger_of(config)
    tracker = outcomes.tracker(config)
    block = ledger.block(tracker.outcomes) if ledger is not None else None
    if block is not None and tracker.unfinished["reason"] == outcomes.NOT_FINISHED:
        tracker.stamp_unfinished({"status": outcomes.ERROR,
                                  "reason": interrupted.interrupted_reason(block["during"])})
    return block


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
    state.write_errors.extend(output["write_errors"])


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = afd_session(config)
    if is_worker(config):
        return
    if state.selected_no_case and not config.option.collectonly:
        write_no_case_selected(terminalreporter, state, config, SUMMARY_FILE)
    stopped = interrupted_block(config)
    gates = gate_runs.ledger_of(config)
    leading = [] if stopped is None else [stopped["line"]]
    if gates is not None and gates.gate_cases:
        leading.append(gates.line())
    if state.written or state.golden_updates or state.lost_workers:
        write_results_table(terminalreporter, state, SUMMARY_FILE, leading=leading,
                            stopped=stopped is not None)
    elif stopped is not None:
        terminalreporter.write_line(f"afd: {stopped['line']}", yellow=True)
    write_write_errors(terminalreporter, state, EXIT_RESULTS_UNWRITABLE)
    note = topology_note(state.options)
    if note is not None:
        terminalreporter.write_line(note, yellow=True)
