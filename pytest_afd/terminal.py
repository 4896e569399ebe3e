"""The ``pytest-afd results`` section of the terminal summary (controller only)."""

from __future__ import annotations

import difflib
import re
from typing import Any

from pytest_afd import profile_ledger, verdicts
from pytest_afd.markers import MARKERS, STAGE_MARKERS
from pytest_afd.session import AfdSession

MARK_OPERATORS = frozenset(("and", "or", "not"))


def _format_value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def write_results_table(reporter: Any, state: AfdSession, summary_file: str) -> None:
    """One row per written result, then where the files and the summary are."""
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
            f"(summary: {state.options.results_dir / summary_file})"
        )
        reporter.write_line("verdicts (python -m pytest_afd report for the full report):")
        write_profile_lines(reporter, state)
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
