"""The report, A/B comparison, trace and check tools of ``pytest-afd``.

- ``report RESULTS_DIR [--output DIR] [--all-sessions]``: Markdown + HTML + PNG report
  of the latest session (every session with ``--all-sessions``).
- ``compare A B [--output DIR] [--calibration FILE | --no-calibration]``: every case
  shared by two result selections side by side, with ratio, dispersion, both hosts'
  conditions and a call beyond the between-session noise, per case and per stage;
  ``compare --calibrate RUN RUN [RUN...]`` stores this host's A/A calibration.
- ``trace-imbalance [--max-batch-requests 8] [--json]``: the best request-boundary
  split imbalance of the shipped Azure traces (the numbers in docs/workloads.md).
- ``fault-check [--fault NAME] [--jobs N] [--control]``: runs ``pytest -m gate``
  under each seeded split-path fault and fails unless every run fails
  (docs/gates.md, "Seeded faults").
- ``profile-summary DIR... [--output DIR]``: profiles taken by hand (ascend_pt role
  directories or a CPU run's torch traces) -> profile.json and the per-layer and
  overlap plots (docs/profiling.md).

Each tool is one ``_add_<name>`` parser builder (written against argparse's
subparsers API, so it also fits a parent parser) and one ``_<name>(args)`` runner;
``_single`` gives the builder a parser of its own named ``prog``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

DEFAULT_BATCH_REQUESTS = 8  # the recipe's --max-num-seqs
USAGE_ERROR = 2
PERCENT = 100.0
# trace-imbalance: what each printed key means (shown with the text output).
TRACE_KEYS = {
    "batches": "batches of up to max_batch_requests requests, replayed in arrival order",
    "mean": "mean over batches of the best request-boundary split's |t0 - t1| / T",
    "p90": "90th percentile of that imbalance over batches",
    "unsplittable_fraction": "share of batches with one request (no request boundary to cut)",
}


# --- report ----------------------------------------------------------------------------
def _add_report(commands: argparse._SubParsersAction) -> None:
    report = commands.add_parser(
        "report",
        help="render a results directory into report.md, report.html and plots",
        description="Render RESULTS_DIR into report.md, report.html and plots/*.png.",
    )
    report.add_argument("results_dir", help="directory holding the result JSON files")
    report.add_argument(
        "--output", default=None, help="report directory (default: RESULTS_DIR/report)"
    )
    report.add_argument(
        "--all-sessions",
        action="store_true",
        help="report the results of every session (default: only the latest session)",
    )
    report.add_argument(
        "--no-plots",
        action="store_true",
        help="tables and conclusions only, no plots/*.png (most of a report's time is drawing)",
    )


def _report(args: argparse.Namespace) -> int:
    from pytest_afd.report import ReportError, render  # lazy: matplotlib only here

    try:
        path = render(args.results_dir, args.output, all_sessions=args.all_sessions,
                      plots=not args.no_plots)
    except (FileNotFoundError, ReportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print(path)
    return 0


# --- compare ---------------------------------------------------------------------------
def _add_compare(commands: argparse._SubParsersAction) -> None:
    compare = commands.add_parser(
        "compare",
        help="A/B: every shared case of two result selections side by side",
        description="Compare two results directories (or two sessions or stacks of one): "
        "per shared case and per stage, B / A with a bootstrap interval and a call made only "
        "beyond the noise between sessions on this host (a stored A/A calibration, else a "
        "conservative rule the output states). Prints the verdict and writes compare.md, "
        "compare.html and plots. 'compare --calibrate RUN RUN [RUN...]' stores the A/A "
        "calibration of runs of the same code instead.",
    )
    compare.add_argument("a", nargs="?", help="results directory A (the baseline)")
    compare.add_argument("b", nargs="?",
                         help="results directory B (may be A, with another session/stack)")
    for side in ("a", "b"):
        compare.add_argument(
            f"--{side}-session", default=None, help=f"only session ID of {side.upper()}"
        )
        compare.add_argument(
            f"--{side}-stack",
            default=None,
            help=f"only the stack of {side.upper()} whose manifest digest starts with this",
        )
    compare.add_argument(
        "--all-sessions",
        action="store_true",
        help="use every session of each side (default: each side's latest session)",
    )
    compare.add_argument(
        "--output", default=None,
        help="output directory (default: ./afd-compare/<A>-vs-<B>, beside neither input)",
    )
    compare.add_argument(
        "--calibrate",
        nargs="+",
        default=None,
        metavar="RUN",
        help="results directories of runs of the same code (every session is one run): "
        "store the widest A/A deviation of every pair as this host's calibration "
        "(at --calibration FILE, else $AFD_CALIBRATION, else "
        "~/.cache/pytest-afd/calibration-<host>.json)",
    )
    compare.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="the A/A calibration to use or write (default: this host's, when it exists)",
    )
    compare.add_argument(
        "--no-calibration", action="store_true",
        help="ignore this host's stored calibration: use the conservative rule",
    )


def _calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pytest_afd.report.noise import default_calibration_path
    from pytest_afd.report.stage_calls import calibrate_runs

    if args.a is not None:
        print("error: --calibrate RUN... takes the runs as its own arguments, not A B",
              file=sys.stderr)
        return USAGE_ERROR
    path = Path(args.calibration) if args.calibration else default_calibration_path()
    try:
        _, lines = calibrate_runs([Path(run) for run in args.calibrate], path)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print("\n".join(lines))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pytest_afd.report import ReportError
    from pytest_afd.report.compare_report import render_comparison
    from pytest_afd.report.noise import default_calibration_path, read_calibration
    from pytest_afd.report.selection import Side

    if args.calibrate is not None:
        return _calibrate(args)
    if args.a is None or args.b is None:
        print("error: compare needs A and B (or --calibrate RUN RUN [RUN...])", file=sys.stderr)
        return USAGE_ERROR
    sides = [
        Side(Path(path), session, stack, args.all_sessions)
        for path, session, stack in (
            (args.a, args.a_session, args.a_stack),
            (args.b, args.b_session, args.b_stack),
        )
    ]
    output = None if args.output is None else Path(args.output)
    stored = default_calibration_path()
    try:
        if args.calibration is not None:
            calibration = read_calibration(Path(args.calibration))
        elif not args.no_calibration and stored.is_file():
            calibration = read_calibration(stored, f"this host's calibration ({stored})")
        else:
            calibration = None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    try:
        _, lines = render_comparison(*sides, output, calibration=calibration)
    except (FileNotFoundError, ReportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print("\n".join(lines))
    return 0


# --- trace-imbalance -----------------------------------------------------------------------
def _add_trace_imbalance(commands: argparse._SubParsersAction) -> None:
    imbalance = commands.add_parser(
        "trace-imbalance",
        help="request-boundary split imbalance of the shipped traces",
        description="Best request-boundary split imbalance of the shipped Azure traces.",
    )
    imbalance.add_argument(
        "--max-batch-requests",
        type=int,
        default=DEFAULT_BATCH_REQUESTS,
        help="requests per replayed batch (default: %(default)s)",
    )
    imbalance.add_argument("--json", action="store_true", help="print JSON instead of a table")


def trace_imbalance_summary(max_batch_requests: int) -> dict:
    from pytest_afd.workloads import TRACE_NAMES, trace_boundary_imbalance

    traces = {}
    for name in TRACE_NAMES:
        measured = trace_boundary_imbalance(name, max_batch_requests=max_batch_requests)
        traces[name] = {
            "batches": int(measured.per_batch.size),
            "mean": measured.mean,
            "p90": measured.p90,
            "unsplittable_fraction": measured.unsplittable_fraction,
        }
    return {"max_batch_requests": max_batch_requests, "traces": traces}


def trace_imbalance_text(summary: dict) -> str:
    """A table with one row per trace and the meaning of every column under it."""
    lines = [
        f"request-boundary split imbalance, max_batch_requests={summary['max_batch_requests']}",
        f"{'trace':<8} {'batches':>8} {'mean':>8} {'p90':>8} {'unsplittable_fraction':>22}",
    ]
    for name, row in summary["traces"].items():
        lines.append(
            f"{name:<8} {row['batches']:>8} {row['mean'] * PERCENT:>7.2f}% "
            f"{row['p90'] * PERCENT:>7.2f}% {row['unsplittable_fraction'] * PERCENT:>21.2f}%"
        )
    lines += ["", "keys:"] + [f"  {key}: {meaning}" for key, meaning in TRACE_KEYS.items()]
    return "\n".join(lines)


def _trace_imbalance(args: argparse.Namespace) -> int:
    try:
        summary = trace_imbalance_summary(args.max_batch_requests)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print(json.dumps(summary, indent=2) if args.json else trace_imbalance_text(summary))
    return 0


# --- fault-check (pytest_afd.faults.check) ----------------------------------------------------
def _add_fault_check(commands: argparse._SubParsersAction) -> None:
    from pytest_afd.faults import check as fault_check

    fault_check.add_parser(commands)


def _fault_check(args: argparse.Namespace) -> int:
    from pytest_afd.faults import check as fault_check

    return fault_check.main(args)


# --- profile-summary (pytest_afd.profiling.summary) -----------------------------------------
def _add_profile_summary(commands: argparse._SubParsersAction) -> None:
    from pytest_afd.profiling import summary

    summary.add_parser(commands)


def _profile_summary(args: argparse.Namespace) -> int:
    from pytest_afd.profiling import summary

    return summary.run(args)


# --- one parser per command ------------------------------------------------------------------
class _Single:
    """Stands in for argparse's subparsers action: the one parser a builder adds is a
    top-level parser named ``prog`` (``pytest-afd report``), with the builder's help as
    its description when it gives none."""

    def __init__(self, prog: str) -> None:
        self.prog = prog
        self.parser: argparse.ArgumentParser | None = None

    def add_parser(self, name: str, *, help: str | None = None, **kwargs) -> argparse.ArgumentParser:
        del name  # the name is already in prog
        kwargs.setdefault("description", help)
        self.parser = argparse.ArgumentParser(prog=self.prog, **kwargs)
        return self.parser


def _single(add: Callable, argv: Sequence[str], prog: str) -> argparse.Namespace:
    holder = _Single(prog)
    add(holder)
    assert holder.parser is not None, f"{add.__name__} added no parser"
    return holder.parser.parse_args(list(argv))


def report(argv: Sequence[str], prog: str) -> int:
    return _report(_single(_add_report, argv, prog))


def compare(argv: Sequence[str], prog: str) -> int:
    return _compare(_single(_add_compare, argv, prog))


def trace_imbalance(argv: Sequence[str], prog: str) -> int:
    return _trace_imbalance(_single(_add_trace_imbalance, argv, prog))


def fault_check(argv: Sequence[str], prog: str) -> int:
    return _fault_check(_single(_add_fault_check, argv, prog))


def profile_summary(argv: Sequence[str], prog: str) -> int:
    return _profile_summary(_single(_add_profile_summary, argv, prog))
