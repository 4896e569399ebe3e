"""The ``pytest-afd results`` section of the terminal summary (controller only)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Generator
from typing import Any

import pytest

from pytest_afd.core.markers import MARKERS, STAGE_MARKERS
from pytest_afd.results import profile_ledger
from pytest_afd.results.shared import kept_sessions_line
from pytest_afd.run import gate_runs, hardware, outcomes
from pytest_afd.run.session import AfdSession
from pytest_afd.stats import verdicts

MARK_OPERATORS = frozenset(("and", "or", "not"))
PERCENT = 100.0
PASSED = "passed"
MAX_NAMED_CASES = 5  # cases named per row of the outcome table; the rest are counted
INTERRUPTED = "interrupted"  # the outcome of the case a Ctrl-C stopped (pytest_afd.run.interrupted)


def _format_value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_cv(cv: float | None) -> str:
    """CV in percent, as the report shows it (report/tables.py), never a bare fraction."""
    return "-" if cv is None else f"{cv * PERCENT:.1f}%"


def _labels(entry: dict[str, Any]) -> str:
    on = (("synthetic", entry["synthetic"]),
          ("exploratory", entry["comparability"] == "exploratory"))
    return ",".join(label for label, flag in on if flag) or "-"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)
                      ).rstrip() for row in [header, *rows]]


def outcome_rows(entries: list[dict[str, Any]], case_outcomes: dict[str, str]
                 ) -> list[tuple[str, ...]]:
    """One row per test function: how many of its cases passed, failed, ... (a gate has no
    headline figure: its result is its outcome). Cases not passed are named in the row."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        groups.setdefault(entry["nodeid"].split("[", 1)[0], []).append(entry)
    rows = []
    for test, members in sorted(groups.items()):
        counts: dict[str, int] = {}
        for entry in members:
            outcome = case_outcomes.get(entry["nodeid"], "unknown")
            counts[outcome] = counts.get(outcome, 0) + 1
        text = ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items()))
        odd = sorted(entry["case_id"].removeprefix(test) for entry in members
                     if case_outcomes.get(entry["nodeid"], "unknown") != PASSED)
        if odd:
            shown = ", ".join(odd[:MAX_NAMED_CASES])
            more = len(odd) - MAX_NAMED_CASES
            text += f": {shown}{f' and {more} more' if more > 0 else ''}"
        rows.append((test, members[0]["case_kind"], str(len(members)), text))
    return rows


def measured_rows(entries: list[dict[str, Any]], case_outcomes: dict[str, str]
                  ) -> list[tuple[str, ...]]:
    """One row per case with a headline figure: its median and CV (percent)."""
    return [(entry["case_id"], entry["case_kind"], case_outcomes.get(entry["nodeid"], "unknown"),
             f"{entry['metric']} {_format_value(entry['median'])} {entry['unit']}".strip(),
             format_cv(entry["cv"]), _labels(entry))
            for entry in sorted(entries, key=lambda e: e["case_id"])]


def write_results_table(reporter: Any, state: AfdSession, summary_file: str, *,
                        leading: list[str] | None = None, stopped: bool = False) -> None:
    """Gate-style cases (no headline figure) as outcome counts per test; measured cases one
    row each with their figure; then where the files and the summary are.

    ``leading``: session lines that lead the verdicts (an interrupted session's
    ``interrupted: 12 of 17 cases not run``, the gates' split-path count);
    ``stopped``: the session was interrupted, so a case without an outcome (the one
    running) shows ``interrupted``, not ``unknown``.
    """
    reporter.section("pytest-afd results")
    case_outcomes = state.outcomes
    if stopped:
        case_outcomes = {**{entry["nodeid"]: INTERRUPTED for entry in state.written},
                         **case_outcomes}
    measured = [entry for entry in state.written if entry["median"] is not None]
    outcome_only = [entry for entry in state.written if entry["median"] is None]
    if outcome_only:
        for line in _table(("test (cases without a headline figure)", "kind", "cases",
                            "outcomes"), outcome_rows(outcome_only, case_outcomes)):
            reporter.write_line(line)
    if measured:
        if outcome_only:
            reporter.write_line("")
        for line in _table(("case", "kind", "outcome", "headline (median)", "CV", "labels"),
                           measured_rows(measured, case_outcomes)):
            reporter.write_line(line)
    if state.written:
        reporter.write_line(
            f"{len(state.written)} result JSON file(s) in {state.options.results_dir} "
            f"(summary: {state.options.results_dir / summary_file})"
        )
        kept = kept_sessions_line(state.options.results_dir,
                                  (entry["case_id"] for entry in state.written),
                                  outcomes.tracker(state.config).session_id)
        if kept:
            reporter.write_line(kept)
        reporter.write_line("verdicts (pytest-afd report for the full report):")
        write_profile_lines(reporter, state)
        for line in leading or ():
            reporter.write_line(f"  {line}")
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


def write_profile_lines(reporter: Any, state: AfdSession) -> None:
    """The session's profile count first (issue 45): red when it fails the session,
    then a warning naming the cases of a partial loss."""
    profiles = profile_ledger.count_entries(state.written)
    requested = state.options.profile
    if not (profiles.instrumented or requested):
        return
    failing = profiles.fails(requested)
    reporter.write_line(f"  {profiles.line(requested)}", red=failing, yellow=not failing
                        and bool(profiles.lost))
    warning = profiles.warning()
    if warning:
        reporter.write_line(f"  warning: {warning}", yellow=True)


def write_no_case_selected(reporter: Any, state: AfdSession, config: Any, summary_file: str
                           ) -> None:
    """No gate or stage case ran: say so, that nothing was replaced, and which markers exist."""
    selection = " ".join(f"{flag} {value!r}" for flag, value in
                         (("-m", config.option.markexpr), ("-k", config.option.keyword)) if value)
    message = (f"afd: no gate or stage case ran{f' ({selection})' if selection else ''}; "
               f"{state.options.results_dir} was left as it was ({summary_file} not replaced)")
    if not selection:  # unit tests run by path: one line is enough
        reporter.write_line(message)
        return
    reporter.section("pytest-afd: no AFD case selected", yellow=True)
    reporter.write_line(message)
    words = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", config.option.markexpr or "")
    close = sorted({match for word in words if word not in MARKERS and word not in MARK_OPERATORS
                    for match in difflib.get_close_matches(word, list(MARKERS), n=1)})
    if close:
        reporter.write_line(f"afd: did you mean -m {' or '.join(close)}?")
    reporter.write_line("afd: markers:")
    for name, text in MARKERS.items():
        reporter.write_line(f"  {name}: {text}")


def write_write_errors(reporter: Any, state: AfdSession, exit_status: int) -> None:
    """Writes that failed (a full disk), one line each, and the session's exit status."""
    if not state.write_errors:
        return
    reporter.section("pytest-afd: results not written", red=True)
    for message in state.write_errors:
        reporter.write_line(f"afd: {message}", red=True)
    reporter.write_line(f"afd: the session exits with status {exit_status} (results "
                        "incomplete)", red=True)


def failure_reasons(config: Any, state: AfdSession) -> list[str]:
    """Why the plugin failed a session whose tests may all have passed (empty: it did not)."""
    reasons = []
    ledger = config.pluginmanager.get_plugin(hardware.PLUGIN_NAME)
    if ledger is not None and ledger.failed_session:
        if ledger.require_hardware and not ledger.requirement_met:
            text = (f"--afd-require-hardware: {len(ledger.on_hardware)} cases measured on "
                    f"hardware (backend {ledger.backend_name})")
            if ledger.on_stand_in:
                text += (f", {len(ledger.on_stand_in)} on a stand-in server (device "
                         f"{ledger.stand_in_device}; --afd-allow-emulated counts those)")
            reasons.append(text)
        if ledger.missing_from_record:
            reasons.append(f"the check phase measured {len(ledger.missing_from_record)} case(s) "
                           "fewer than the record phase recorded")
    gates = config.pluginmanager.get_plugin(gate_runs.PLUGIN_NAME)
    if gates is not None and gates.failed_session:
        reasons.append(f"{gates.fail_reason}: 0 of {len(gates.counted())} split-path gate "
                       "cases ran against the deployment")
    if state.write_errors:
        reasons.append(f"{len(state.write_errors)} result write(s) failed: "
                       f"{state.write_errors[0]}")
    return reasons


class FinalLine:
    """Writes why the plugin failed a session AFTER pytest's stats line.

    pytest prints its stats line ("1 passed in 59.61s") last, from its terminal
    reporter's ``pytest_sessionfinish`` wrapper, after every ``pytest_terminal_summary``
    hook (even ``trylast`` ones); a reader who sees only the end of a CI log would take
    a session failed by ``--afd-require-hardware`` for a pass. A ``tryfirst`` wrapper
    is the outermost one, so the code after its ``yield`` runs after that line.
    """

    def __init__(self, state: AfdSession) -> None:
        self.state = state

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        result = yield
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reasons = failure_reasons(session.config, self.state)
        if reporter is not None and reasons and session.exitstatus != pytest.ExitCode.OK:
            reporter.write_sep("=", f"pytest-afd: session failed (exit status "
                               f"{int(session.exitstatus)}): {'; '.join(reasons)}", red=True)
        return result
