"""``python -m pytest_afd report RESULTS_DIR``: render the Markdown + PNG report.

``python -m pytest_afd trace-imbalance [--max-batch-requests 8]`` prints, as
JSON, the best request-boundary split imbalance of the shipped Azure traces
replayed in arrival order (the numbers quoted in docs/workloads.md).

``python -m pytest_afd fault-check [--fault NAME] [--jobs N] [--control]``
runs ``pytest -m gate`` under each seeded split-path fault and fails unless
every run fails (docs/gates.md, "Seeded faults").
"""

from __future__ import annotations

import argparse
import json
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
    imbalance = commands.add_parser(
        "trace-imbalance", help="request-boundary split imbalance of the shipped traces (JSON)"
    )
    imbalance.add_argument(
        "--max-batch-requests",
        type=int,
        default=DEFAULT_BATCH_REQUESTS,
        help="default: %(default)s",
    )
    from pytest_afd import fault_check

    fault_check.add_parser(commands)
    return parser


DEFAULT_BATCH_REQUESTS = 8  # the recipe's --max-num-seqs


def _trace_imbalance(max_batch_requests: int) -> int:
    from pytest_afd.workloads import TRACE_NAMES, trace_boundary_imbalance

    summary = {}
    for name in TRACE_NAMES:
        measured = trace_boundary_imbalance(name, max_batch_requests=max_batch_requests)
        summary[name] = {
            "batches": int(measured.per_batch.size),
            "mean": measured.mean,
            "p90": measured.p90,
            "unsplittable_fraction": measured.unsplittable_fraction,
        }
    print(json.dumps({"max_batch_requests": max_batch_requests, "traces": summary}, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "fault-check":
        from pytest_afd import fault_check

        return fault_check.main(args)
    if args.command == "trace-imbalance":
        try:
            return _trace_imbalance(args.max_batch_requests)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
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
