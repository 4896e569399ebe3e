"""No false green: how many cases a hardware backend really measured, said out loud.

A ``--afd-backend vllm-ascend`` session on a machine without a deployment
skips every case that needs one, and the pure-Python checks still pass, so the
session would exit 0 and a misconfigured CI node would look green. The ledger
counts the test cases whose call completed at least one backend run on
hardware and then ended in an outcome (passed or failed: a case that skipped
after its runs, e.g. for want of a split-none reference deployment, measured
nothing and is listed apart). A run on the harness's own CPU HTTP server is
counted apart as a stand-in in every mode (launched, attached, deployed by a
command): the server labels itself and the backend reads the label per run.
The ledger reports the counts in the terminal summary and in
``summary.json``, and with ``--afd-require-hardware`` turns zero into a failed
session (``--afd-allow-emulated``: stand-in cases meet the requirement, still
counted apart). A ``--afd-reference-phase record`` session writes the cases it
measured next to the references; the ``check`` phase fails, naming them, when
it measured fewer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# Backends whose results are claims about real devices.
HARDWARE_BACKENDS = ("vllm-ascend",)
SUMMARY_KEY = "hardware"
PLUGIN_NAME = "afd-hardware-ledger"
# pytest-xdist: a worker's counts travel to the controller under this workeroutput key.
WORKEROUTPUT_KEY = "afd_hardware"
RECORDED_CASES_FILE = "record-phase-cases.json"
PHASE_RECORD = "record"
PHASE_CHECK = "check"
STAND_IN = "stand_in"
HARDWARE = "hardware"


@dataclass(eq=False)  # identity-hashed: registered as a pytest plugin
class HardwareLedger:
    """Per-session count of cases measured on hardware (xdist workers report to the controller)."""

    backend_name: str
    require_hardware: bool
    # The backends created so far: the session's (if any) and a suite's others (never creates one).
    current_backends: Callable[[], list[Any]]
    on_hardware: list[str] = field(default_factory=list)
    on_stand_in: list[str] = field(default_factory=list)
    allow_emulated: bool = False
    phase: str = "live"
    golden_dir: Path | None = None
    stand_in_device: str | None = None
    failed_session: bool = False
    # Cases that completed runs on the deployment, then skipped: never counted as measured.
    skipped_after_runs: list[str] = field(default_factory=list)
    # Node id -> where its runs went (STAND_IN / HARDWARE), until its call report arrives.
    _pending: dict[str, str] = field(default_factory=dict)
    # Check phase: cases the record phase measured that this session did not.
    missing_from_record: list[str] = field(default_factory=list)

    @property
    def applies(self) -> bool:
        return self.backend_name in HARDWARE_BACKENDS

    def _run_counts(self) -> tuple[int, int]:
        """(completed runs, of them on a stand-in) over every backend, through any wrapper
        (worker evidence): each HTTP backend's own counts."""
        completed = stand_in = 0
        for backend in self.current_backends():
            completed += getattr(backend, "completed_runs", 0) or 0
            stand_in += getattr(backend, "stand_in_runs", 0) or 0
        return completed, stand_in

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        before = self._run_counts()
        try:
            return (yield)
        finally:
            after = self._run_counts()
            if self.applies and after[0] > before[0]:
                # Counted once the report says the case ended in an outcome (not skipped).
                self._pending[item.nodeid] = self._where(after[1] > before[1])

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """A case that ran on the deployment counts only when it ran to an outcome: one that
        skipped after its runs (a reference deployment missing) measured nothing."""
        if report.when != "call" or report.nodeid not in self._pending:
            return
        where = self._pending.pop(report.nodeid)
        if report.skipped:
            self.skipped_after_runs.append(report.nodeid)
        else:
            (self.on_stand_in if where == STAND_IN else self.on_hardware).append(report.nodeid)

    def _where(self, stand_in_runs: bool) -> str:
        """``STAND_IN`` when a run was served by a labelled stand-in (the backends' per-run
        count) or any backend says it is one (``stand_in_device``), else ``HARDWARE``:
        never hardware on a doubt."""
        for backend in self.current_backends():
            ask = getattr(backend, "stand_in_device", None)
            device = ask() if ask is not None else None
            self.stand_in_device = self.stand_in_device or device
            stand_in_runs = stand_in_runs or device is not None
        return STAND_IN if stand_in_runs else HARDWARE

    @property
    def measured(self) -> list[str]:
        return sorted(set(self.on_hardware) | set(self.on_stand_in))

    @property
    def requirement_met(self) -> bool:
        return bool(self.on_hardware) or (self.allow_emulated and bool(self.on_stand_in))

    def _recorded_path(self) -> Path | None:
        return None if self.golden_dir is None else Path(self.golden_dir) / RECORDED_CASES_FILE

    def _compare_phases(self) -> None:
        """Record: write the measured cases. Check: name those the record phase had and this lacks."""
        path = self._recorded_path()
        if path is None:
            return
        if self.phase == PHASE_RECORD:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"measured_cases": self.measured}, indent=2) + "\n")
        elif self.phase == PHASE_CHECK and path.is_file():
            recorded = json.loads(path.read_text())["measured_cases"]
            self.missing_from_record = sorted(set(recorded) - set(self.measured))

    def summary(self) -> dict[str, Any] | None:
        """The ``summary.json`` entry (None for an emulated backend such as ``cpu``)."""
        if not self.applies:
            return None
        return {
            "backend": self.backend_name,
            "cases_measured_on_hardware": len(self.on_hardware),
            "cases_on_stand_in": len(self.on_stand_in),
            "stand_in_device": self.stand_in_device,
            "require_hardware": self.require_hardware,
            "allow_emulated": self.allow_emulated,
            "fails_session": self.failed_session,
            "measured_cases": sorted(self.on_hardware),
            "stand_in_cases": sorted(self.on_stand_in),
            "skipped_after_runs": sorted(self.skipped_after_runs),
            "missing_from_record_phase": self.missing_from_record,
        }

    def line(self) -> str:
        text = f"{len(self.on_hardware)} cases measured on hardware (backend {self.backend_name})"
        if self.on_stand_in:
            text += (f"; {len(self.on_stand_in)} ran on a pytest-afd server standing in for the "
                     f"deployment (device {self.stand_in_device})")
        if self.skipped_after_runs:
            text += (f"; {len(self.skipped_after_runs)} ran on the deployment but skipped "
                     "(not counted as measured)")
        if self.require_hardware and not self.requirement_met:
            text += "; --afd-require-hardware: failing the session"
        if self.missing_from_record:
            text += (f"; the check phase measured {len(self.missing_from_record)} case(s) fewer "
                     f"than the record phase recorded ({self._recorded_path()}): "
                     f"{', '.join(self.missing_from_record)}; failing the session")
        return text

    @pytest.hookimpl(tryfirst=True)  # before the plugin writes summary.json
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        config = session.config
        if hasattr(config, "workerinput"):  # an xdist worker: the controller decides
            config.workeroutput[WORKEROUTPUT_KEY] = {
                "on_hardware": self.on_hardware, "on_stand_in": self.on_stand_in,
                "stand_in_device": self.stand_in_device,
                "skipped_after_runs": self.skipped_after_runs}
            return
        listing_only = session.config.getoption("afd_list_deployments", False)
        if not self.applies or listing_only or session.config.getoption("collectonly") or session.exitstatus not in (
                pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED):
            return  # an interrupted or stopped session has said why already
        self._compare_phases()
        if (self.require_hardware and not self.requirement_met) or self.missing_from_record:
            self.failed_session = True
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """pytest-xdist: add a finished worker's counts (a crashed worker sends none)."""
        if error is not None:
            return
        output = node.workeroutput.get(WORKEROUTPUT_KEY)
        if output is None:
            return
        self.on_hardware.extend(output["on_hardware"])
        self.on_stand_in.extend(output["on_stand_in"])
        self.skipped_after_runs.extend(output.get("skipped_after_runs", []))
        self.stand_in_device = self.stand_in_device or output["stand_in_device"]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.applies:
            terminalreporter.write_sep("-", "pytest-afd hardware")
            terminalreporter.write_line(self.line())
