"""Interrupted is an outcome: a Ctrl-C session says how many of its cases never ran.

A ``KeyboardInterrupt`` (SIGINT, or raised by a test) stops pytest inside the
running case: that case gets no report, the later ones never start, and a
result the running case had written keeps its provisional stamp. Without this
the terminal table said outcome "unknown" and the verdicts "error: the test did
not finish", which reads as a broken test, not as a stopped session. The
ledger remembers the selected AFD cases (gate and stage markers) and the case
that was running; at the end the terminal, ``summary.json`` (``interrupted``)
and the report say ``interrupted: 12 of 17 cases not run`` (a case not run is
one with no outcome), and the running case's result is stamped with the
interruption as its reason.

Under pytest-xdist the controller collects nothing itself: the selected count
is absent there, with its reason (the outcomes still arrive).
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_afd.core.absent import absent
from pytest_afd.results.shared import INTERRUPTED_SUMMARY_KEY as SUMMARY_KEY
from pytest_afd.run.session import AFD_CASE_MARKERS

PLUGIN_NAME = "afd-interrupted"
__all__ = ["SUMMARY_KEY", "InterruptLedger", "register"]
XDIST_CONTROLLER = "dsession"  # pytest-xdist's controller plugin (registered with -n)
NO_SELECTION_REASON = ("the xdist controller collects no tests itself; its workers do, and "
                       "an interrupted worker does not report its selection")


def interrupted_reason(during: str | None) -> str:
    """The outcome reason of the case that was running when the session was interrupted."""
    where = f" during {during}" if during else ""
    return f"interrupted: the session was interrupted (KeyboardInterrupt){where} before this case finished"


def line(not_run: int | None, selected: int | None, during: str | None) -> str:
    """``interrupted: 12 of 17 cases not run (KeyboardInterrupt during <case>)``."""
    counts = (f"{not_run} of {selected} cases not run" if selected is not None
              else "the number of cases not run is unknown (pytest-xdist)")
    where = f" during {during}" if during else ""
    return f"interrupted: {counts} (KeyboardInterrupt{where})"


class InterruptLedger:
    """Registered by the plugin: the selected AFD cases, the running one, the interruption."""

    def __init__(self) -> None:
        self.selected: list[str] | None = None
        self.running: str | None = None
        self.interrupted = False
        self.during: str | None = None

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        config = session.config
        if config.pluginmanager.hasplugin(XDIST_CONTROLLER) and not hasattr(config, "workerinput"):
            return  # the controller's items are empty: the count stays absent
        self.selected = [item.nodeid for item in session.items
                         if not AFD_CASE_MARKERS.isdisjoint(mark.name for mark in item.iter_markers())]

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self.running = nodeid

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self.running = None

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        self.interrupted = True
        self.during = self.running

    def block(self, outcomes: dict[str, Any]) -> dict[str, Any] | None:
        """The ``summary.json`` entry (None when the session was not interrupted or selected
        no AFD case); ``outcomes``: node id -> outcome of every case that reached one."""
        if not self.interrupted or self.selected == []:
            return None
        if self.selected is None:
            return {"line": line(None, None, self.during), "during": self.during,
                    "cases_selected": absent(NO_SELECTION_REASON),
                    "cases_not_run": absent(NO_SELECTION_REASON)}
        not_run = [nodeid for nodeid in self.selected if nodeid not in outcomes]
        return {"line": line(len(not_run), len(self.selected), self.during),
                "during": self.during, "cases_selected": len(self.selected),
                "cases_not_run": len(not_run), "not_run": not_run}


def register(config: pytest.Config) -> InterruptLedger:
    ledger = InterruptLedger()
    config.pluginmanager.register(ledger, PLUGIN_NAME)
    return ledger


def ledger_of(config: pytest.Config) -> InterruptLedger | None:
    return config.pluginmanager.get_plugin(PLUGIN_NAME)
