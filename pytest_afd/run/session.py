"""Per-process plugin state: options, the backend (made once), the manifest, written results."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_afd.backends import create_backend
from pytest_afd.core.backend import Backend, BackendUnavailable
from pytest_afd.core.markers import STAGE_MARKERS
from pytest_afd.results.documents import validate_manifest
from pytest_afd.results.manifest import collect_manifest, manifest_digest
from pytest_afd.results.shared import SessionLease
from pytest_afd.run.hardware import HARDWARE_BACKENDS
from pytest_afd.run.options import AfdOptions

# Markers of the cases that write results (a session with none leaves the directory alone).
AFD_CASE_MARKERS = frozenset(("gate", *STAGE_MARKERS))
EXIT_BACKEND_UNAVAILABLE = 8
"""Exit status of an ``--afd-require-hardware`` session whose backend cannot be created: the
session stops at the first case that needs it, with one message (not one failure per case)."""


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
    # Result/summary writes that failed (a full disk): reported at the end, exit status set.
    write_errors: list[str] = field(default_factory=list)
    # The controller's claim on the results dir while the session runs (shared_results).
    lease: SessionLease | None = None
    # Tests carrying a gate/stage marker that reported (controller side: every worker's too).
    afd_cases: int = 0

    @property
    def selected_no_case(self) -> bool:
        """Nothing AFD ran or was written: the results directory must stay as it was.

        A hardware-backend session always writes its summary: its hardware ledger
        ("0 cases measured on hardware") is the evidence a nightly reads."""
        return not (self.written or self.golden_updates or self.lost_workers or self.afd_cases
                    or self.write_errors or self.options.backend in HARDWARE_BACKENDS)

    # Backends a suite made for another model or topology (stage pools): the hardware
    # ledger counts their runs too.
    other_backends: list[Backend] = field(default_factory=list)
    # The device a pytest-afd server standing in for the deployment reported (None: none did).
    stand_in: str | None = None

    @property
    def emulated(self) -> bool:
        return self.options.backend == "cpu"

    def stand_in_device(self) -> str | None:
        """``cpu`` when the session's deployment is the harness's own server (it says so).

        Asked of the backend (never created here); a positive answer is kept.
        """
        if self.stand_in is None and self.backend_instance is not None:
            ask = getattr(self.backend_instance, "stand_in_device", None)
            self.stand_in = ask() if ask is not None else None
        return self.stand_in

    def hardware_kwargs(self) -> dict[str, Any]:
        """What a hardware backend takes from the options: the user's devices per node."""
        given = self.options.given_devices_per_node()
        if self.options.backend not in HARDWARE_BACKENDS or given is None:
            return {}
        return {"devices_per_node": given}

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
                    peer_timeout_s=opts.peer_timeout_s,
                    **self.hardware_kwargs(),
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
        if report.when == "setup" and not AFD_CASE_MARKERS.isdisjoint(report.keywords):
            self.afd_cases += 1
        if report.when == "call":
            self.outcomes[report.nodeid] = report.outcome
        elif report.failed:
            self.outcomes[report.nodeid] = "error"

    def close(self) -> None:
        if self.backend_instance is not None:
            backend, self.backend_instance = self.backend_instance, None
            backend.close()


AFD_SESSION_KEY = pytest.StashKey[AfdSession]()


def write_error(path: Path, error: Exception, consequence: str) -> str:
    """``cannot write <path>: <cause>; <consequence>`` (the OS reason, not a traceback)."""
    cause = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return f"cannot write {path}: {cause.lower()}; {consequence}"


def afd_session(config: pytest.Config) -> AfdSession:
    return config.stash[AFD_SESSION_KEY]


def is_worker(config: pytest.Config) -> bool:
    """A pytest-xdist worker (the controller hands it ``workerinput``)."""
    return hasattr(config, "workerinput")
