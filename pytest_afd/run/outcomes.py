"""Test outcomes and session ids on every result, and a summary.json every session replaces.

Contract (schemas/result.schema.json, read by the report):

* ``result["session_id"]``: one id per pytest session, shared by its xdist
  workers (the controller hands it over in ``workerinput``);
* ``result["outcome"] = {"status": "passed"|"failed"|"error"|"skipped",
  "reason": str | None}``. A result is written while its test runs, so it is
  first stamped ``error`` ("the test did not finish"); after the test's
  teardown the worker that ran it rewrites it with the real outcome (a
  setup/teardown failure is ``error``, an xfail is ``skipped`` with its reason);
* ``summary.json`` is replaced at the end of every session (not ``--co``, which
  runs nothing and writes nothing), also one that
  wrote no result, and carries ``session_id``;
* sessions sharing a results directory never touch each other's results: the
  outcome rewrite is a compare-and-swap on ``session_id`` under the
  directory's lock (:mod:`pytest_afd.results.shared`);
* a write that fails (a full disk) is recorded in ``AfdSession.write_errors``
  and reported once at the end, never an internal error of a hook.
"""

from __future__ import annotations

import datetime as _dt
import uuid
from pathlib import Path
from typing import Any

import pytest

from pytest_afd.results.documents import ResultValidationError
from pytest_afd.results.shared import restamp_outcome, write_session_summary
from pytest_afd.run.session import afd_session, write_error

SESSION_ID_KEY = "afd_session_id"
PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"
NOT_FINISHED = "the test did not finish (no outcome was recorded after its teardown)"
SEVERITY = {PASSED: 0, SKIPPED: 1, FAILED: 2, ERROR: 3}


def new_session_id() -> str:
    """A sortable, unique id: UTC start time plus random hex."""
    started = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{started}-{uuid.uuid4().hex[:12]}"


def _reason(report: pytest.TestReport) -> str | None:
    """The skip reason or the failure's one-line message."""
    longrepr = report.longrepr
    if longrepr is None:
        return None
    if isinstance(longrepr, tuple):  # skip: (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message
    text = str(longrepr).strip().splitlines()
    return text[-1] if text else None


def phase_outcome(report: pytest.TestReport) -> dict[str, Any] | None:
    """The outcome one phase report implies, or None when the phase passed quietly."""
    if hasattr(report, "wasxfail"):
        return {"status": SKIPPED, "reason": f"xfail: {report.wasxfail}".rstrip(": ")}
    if report.skipped:
        return {"status": SKIPPED, "reason": _reason(report)}
    if report.failed:
        status = FAILED if report.when == "call" else ERROR
        return {"status": status, "reason": f"{report.when}: {_reason(report)}"}
    if report.when == "call":
        return {"status": PASSED, "reason": None}
    return None


class OutcomeTracker:
    """Registered by the plugin: session id, per-test outcome, result stamping, summary."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        workerinput = getattr(config, "workerinput", None)
        self.session_id = (
            workerinput[SESSION_ID_KEY]
            if workerinput is not None and SESSION_ID_KEY in workerinput
            else new_session_id()
        )
        self.outcomes: dict[str, dict[str, Any]] = {}
        # The outcome of a written result whose test reached none (an interrupted session
        # replaces it with the interruption: pytest_afd.run.interrupted).
        self.unfinished: dict[str, Any] = {"status": ERROR, "reason": NOT_FINISHED}

    # ---- hooks ------------------------------------------------------------------
    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """pytest-xdist controller: every worker writes under the controller's session id."""
        node.workerinput[SESSION_ID_KEY] = self.session_id

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = phase_outcome(report)
        current = self.outcomes.get(report.nodeid)
        if found is not None and (
            current is None or SEVERITY[found["status"]] >= SEVERITY[current["status"]]
        ):
            self.outcomes[report.nodeid] = found
        if report.when == "teardown":
            self._stamp_final(report.nodeid)

    # ---- results ------------------------------------------------------------------
    def stamp(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The provisional stamp of a result written while its test runs."""
        return {**doc, "session_id": self.session_id,
                "outcome": {"status": ERROR, "reason": NOT_FINISHED}}

    def outcome_of(self, nodeid: str) -> dict[str, Any]:
        return self.outcomes.get(nodeid, self.unfinished)

    def stamp_unfinished(self, outcome: dict[str, Any]) -> None:
        """Stamp the results of tests that reached no outcome (an interrupted session's
        running case) with ``outcome`` instead of "the test did not finish"."""
        self.unfinished = outcome
        state = afd_session(self.config)
        for nodeid in {entry["nodeid"] for entry in state.written
                       if not entry.get("outcome_stamped")}:
            self._stamp_final(nodeid)

    def _stamp_final(self, nodeid: str) -> None:
        """Rewrite the results this process wrote for ``nodeid`` with its real outcome,
        only where the file still holds this session's result."""
        outcome = self.outcome_of(nodeid)
        state = afd_session(self.config)
        for entry in state.written:
            if entry["nodeid"] != nodeid or entry.get("outcome_stamped"):
                continue
            path = Path(entry["path"])
            entry["outcome_stamped"] = True
            try:
                owner = restamp_outcome(state.options.results_dir, path, self.session_id,
                                        outcome)
            except (OSError, ValueError, ResultValidationError) as error:
                state.write_errors.append(write_error(path, error, "its outcome is not recorded"))
                continue
            if owner is not None:
                state.write_errors.append(
                    f"{path} now holds session {owner}'s result: this session's outcome "
                    f"({outcome['status']}) was not written into it")

    def summary(self, written: list[dict[str, Any]], results_dir: Path,
                golden_updates: list[str], extra: dict[str, Any] | None = None) -> dict[str, Any]:
        entries = []
        for entry in written:
            outcome = self.outcome_of(entry["nodeid"])
            entries.append({**{k: v for k, v in entry.items() if k != "outcome_stamped"},
                            "outcome": outcome["status"], "outcome_reason": outcome["reason"]})
        return {
            "session_id": self.session_id,
            "results_dir": str(results_dir),
            "results": sorted(entries, key=lambda e: e["case_id"]),
            "golden_updates": sorted(golden_updates),
            **(extra or {}),
        }

    def write_summary(self, path: Path, written: list[dict[str, Any]], results_dir: Path,
                      golden_updates: list[str], extra: dict[str, Any] | None = None) -> Path:
        """Replace ``path`` (also when this session wrote nothing: never a stale summary),
        and keep this session's own copy beside the other sessions' (under the lock).

        ``extra``: further top-level keys (the plugin's ``lost_workers``).
        """
        summary = self.summary(written, results_dir, golden_updates, extra)
        return write_session_summary(path.parent, path.name, summary)


OUTCOME_PLUGIN = "afd-outcomes"


def register(config: pytest.Config) -> OutcomeTracker:
    tracker = OutcomeTracker(config)
    config.pluginmanager.register(tracker, OUTCOME_PLUGIN)
    return tracker


def tracker(config: pytest.Config) -> OutcomeTracker:
    return config.pluginmanager.get_plugin(OUTCOME_PLUGIN)
