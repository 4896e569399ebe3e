"""``python -m pytest_afd report RESULTS_DIR``: render the Markdown + PNG report."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pytest_afd", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    report = commands.add_parser("report", help="render a results directory into a Markdown report")
    report.add_argument("results_dir", help="directory holding the result JSON files")
    report.add_argument(
        "--output", default=None, help="report directory (default: RESULTS_DIR/report)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from pytest_afd.report import render  # lazy: matplotlib is only needed here

    try:
        path = render(args.results_dir, args.output)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
