"""Attached gates say what ran: how many split-path gate cases ran against the deployment.

Attached to a deployment the gates' settings do not match (the launch plan's
forced routing, W8A8, ``max_num_seqs=32``, no split-none reference), every
split-path case skips with a good reason, the fail-closed and pure-Python
checks pass, and the session used to read "gate: 13 case(s): 13 passed". This
ledger counts the gate cases that run the split path on a backend (those that
request one: ``SPLIT_PATH_FIXTURES``) and how many of them ran: ran to an
outcome (not skipped) and, on a hardware backend, completed at least one run
on the deployment (the hardware ledger's ``measured`` cases, stand-ins
included). It says so after the verdicts and in ``summary.json``
(``gate_runs``), with what the others need, grouped from their skip reasons
(``routing='natural' (25)``, gate 1's split-none reference deployment, ...). A gate
session in which none ran fails under ``--afd-require-hardware`` (the nightly passes it)
and on a hardware backend whenever it selected split-path cases; the record phase,
which runs only the references by design, is exempt.

Under pytest-xdist the workers tag each split-path case's reports
(``user_properties``), so the controller, which collects nothing, counts them.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from typing import Any

import pytest

from pytest_afd.run.outcomes import phase_outcome

PLUGIN_NAME = "afd-gate-runs"
SUMMARY_KEY = "gate_runs"
GATE_MARKER = "gate"
# The fixtures through which a gate case runs the split path on the session's backend.
SPLIT_PATH_FIXTURES = frozenset(("gate_backend", "gate_backends", "afd_backend"))
SPLIT_PATH_PROPERTY = "afd_split_path_case"
CANNOT_RUN_PREFIX = "the backend cannot run this case: "
# "…differs in (deployment, case) {'split_policy': ('token_balanced', 'none')}: deploy one…"
_DIFFERS = re.compile(r"differs in \(deployment, case\) (\{.*?\})(?::|$)")
_OTHER_SESSION = re.compile(r"this case needs (.+?) \(this session")
MAX_REASON_CHARS = 100
UNSPLIT_POLICY = "none"
SPLIT_NONE_NEED = "a second, split-none reference deployment (split_policy='none'; gate 1's reference)"
NO_RUN_NEED = "a run on the deployment (the case ended without one)"
LAUNCH_HINT = ("pytest-afd launch-plan --for-gates prints gate-compatible launch flags "
               "(docs/gates.md)")


def needs_of(reason: str | None) -> list[str]:
    """What a skipped split-path case needs: one entry per deployment setting it differs in
    (``routing='natural'``), else its skip reason, shortened (grouped by across cases)."""
    text = (reason or "no reason given").removeprefix(CANNOT_RUN_PREFIX).strip()
    found = _DIFFERS.search(text)
    if found is not None:
        try:
            differs = ast.literal_eval(found.group(1))
        except (ValueError, SyntaxError):
            differs = None
        if isinstance(differs, dict) and differs:
            return [SPLIT_NONE_NEED if (name, pair[1]) == ("split_policy", UNSPLIT_POLICY)
                    else f"{name}={pair[1]!r}"
                    for name, pair in differs.items()
                    if isinstance(pair, tuple) and len(pair) == 2]  # noqa: PLR2004
    other_session = _OTHER_SESSION.search(text)
    if other_session is not None:  # "...; this case needs --afd-model full (this session: ...)"
        return [f"a session with {other_session.group(1)}"]
    first = text.splitlines()[0].split("; ")[0] if text else text
    return [first if len(first) <= MAX_REASON_CHARS else first[:MAX_REASON_CHARS - 1] + "…"]


class GateRunLedger:
    """Split-path gate cases: selected, ran, and what the others needed."""

    def __init__(self, *, require_hardware: bool, exempt_phase: bool,
                 measured: Any, hardware_backend: bool) -> None:
        self.require_hardware = require_hardware
        self.exempt_phase = exempt_phase  # the record phase runs references only
        self._measured = measured  # () -> node ids the hardware ledger counted
        self.hardware_backend = hardware_backend
        self.split_path: set[str] = set()
        self.gate_cases: set[str] = set()
        self.outcomes: dict[str, dict[str, Any]] = {}
        self.failed_session = False
        self.fail_reason: str | None = None

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            names = set(getattr(item, "fixturenames", ()))
            if item.get_closest_marker(GATE_MARKER) is not None and names & SPLIT_PATH_FIXTURES:
                item.user_properties.append((SPLIT_PATH_PROPERTY, True))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if GATE_MARKER in report.keywords:
            self.gate_cases.add(report.nodeid)
        if (SPLIT_PATH_PROPERTY, True) not in report.user_properties:
            return
        self.split_path.add(report.nodeid)
        found = phase_outcome(report)
        if found is not None and (report.nodeid not in self.outcomes or found["status"] != "passed"):
            self.outcomes[report.nodeid] = found

    def _no_run_passes(self) -> set[str]:
        """Cases that request the backend but passed without a run on it (fail-closed and
        pure checks): not split-path runs, said apart."""
        if not self.hardware_backend:
            return set()
        measured = set(self._measured())
        return {nodeid for nodeid, found in self.outcomes.items()
                if found["status"] == "passed" and nodeid not in measured}

    def counted(self) -> set[str]:
        """The split-path cases: requesting the backend, less those that passed without it."""
        return self.split_path - self._no_run_passes()

    def ran(self) -> list[str]:
        """Split-path cases that ran to an outcome (on a hardware backend: with runs)."""
        done = {nodeid for nodeid, found in self.outcomes.items() if found["status"] != "skipped"}
        if self.hardware_backend:
            done &= set(self._measured())
        return sorted(done & self.counted())

    def needs(self) -> Counter[str]:
        """Need -> the number of split-path cases that did not run for want of it."""
        ran, counted = set(self.ran()), self.counted()
        counts: Counter[str] = Counter()
        for nodeid, found in self.outcomes.items():
            if nodeid in counted and nodeid not in ran:
                counts.update(set(needs_of(found["reason"]) if found["status"] == "skipped"
                                  else [NO_RUN_NEED]))
        return counts

    def line(self) -> str:
        ran, total = len(self.ran()), len(self.counted())
        where = "against the deployment" if self.hardware_backend else "(in-process backend)"
        if self.exempt_phase:  # the record phase runs the references only, never the split
            text = (f"gate (record phase: references only): {ran} of {total} split-path cases "
                    f"recorded their reference {where}")
        else:
            text = f"gate: {ran} of {total} split-path cases ran {where}"
        apart = len(self._no_run_passes())
        if apart:
            text += f" ({apart} other case(s) using it passed without a run on it)"
        needs = self.needs()
        if needs:
            text += "; the others need " + ", ".join(
                f"{need} ({count})" for need, count in needs.most_common())
            if any("=" in need for need in needs):
                text += f"; {LAUNCH_HINT}"
        if self.failed_session:
            text += f"; {self.fail_reason}: failing the session (no split-path case ran)"
        return text

    def summary(self) -> dict[str, Any] | None:
        if not self.gate_cases:
            return None
        return {"split_path_cases": len(self.counted()), "split_path_ran": len(self.ran()),
                "passed_without_a_run": sorted(self._no_run_passes()),
                "ran_cases": self.ran(), "needs": dict(self.needs().most_common()),
                "fails_session": self.failed_session, "line": self.line()}

    @pytest.hookimpl(tryfirst=True)  # before the plugin writes summary.json
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.gate_cases:
            return
        if session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
            return  # interrupted or stopped: said elsewhere
        self.fail_reason = self._fail_reason()
        if self.fail_reason is not None:
            self.failed_session = True
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _fail_reason(self) -> str | None:
        """Why a session in which no split-path case ran fails, or None.

        ``--afd-require-hardware`` asks for it; so does choosing a hardware backend whose
        session selected split-path cases: a wrong or half-given deployment (no settings,
        other settings) would otherwise end green with only the pure checks run."""
        if self.exempt_phase or self.ran():
            return None
        if self.require_hardware:
            return "--afd-require-hardware"
        if self.hardware_backend and self.counted():
            return "on a hardware backend"
        return None

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Its own section (the results table repeats the line among the verdicts)."""
        if self.gate_cases and not hasattr(terminalreporter.config, "workerinput"):
            terminalreporter.write_sep("-", "pytest-afd gates")
            terminalreporter.write_line(self.line(), red=self.failed_session)


def register(config: pytest.Config, *, require_hardware: bool, exempt_phase: bool,
             measured: Any, hardware_backend: bool) -> GateRunLedger:
    ledger = GateRunLedger(require_hardware=require_hardware, exempt_phase=exempt_phase,
                           measured=measured, hardware_backend=hardware_backend)
    config.pluginmanager.register(ledger, PLUGIN_NAME)
    return ledger


def ledger_of(config: pytest.Config) -> GateRunLedger | None:
    return config.pluginmanager.get_plugin(PLUGIN_NAME)
