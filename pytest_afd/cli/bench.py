"""``pytest-afd bench``: the benchmarks in ``benchmarks/`` by name, and their record.

- ``pytest-afd bench --list``: each ``benchmarks/NAME_bench.py`` as ``NAME`` (underscores
  as dashes) with the first line of its docstring (read, not imported).
- ``pytest-afd bench NAME [ARGS...]``: runs ``python benchmarks/NAME_bench.py ARGS``.
- ``pytest-afd bench --record NAME [ARGS...]`` (``bench``'s own options come before
  NAME): the same, with ``--output`` to a temporary file, and stores the benchmark's JSON with what a figure needs to be read
  later (UTC date, load averages before and after, wall and child CPU time, the exact
  command) as ``benchmarks/results/NAME.json``.
- ``pytest-afd bench --docs [--check]``: renders ``docs/benchmarks.md`` from the
  records (``pytest_afd.cli.bench_docs``); ``--check`` fails when the page differs.

Why records: timing figures written by hand into prose go stale silently; a page
generated from dated records says when and under what load each figure was taken.
The benchmarks live in the source tree, not in the installed package, so this
command works from a checkout (``--benchmarks-dir`` points elsewhere).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

USAGE_ERROR = 2
SUFFIX = "_bench.py"
RESULTS = "results"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_BENCHMARKS = REPO / "benchmarks"
DEFAULT_DOCS = REPO / "docs" / "benchmarks.md"
SUMMARY_CHARS = 400  # the one-line summary kept in a record


def benchmark_names(directory: Path) -> dict[str, Path]:
    """``split`` -> ``benchmarks/split_bench.py``, for every ``*_bench.py``."""
    return {path.name[: -len(SUFFIX)].replace("_", "-"): path
            for path in sorted(directory.glob(f"*{SUFFIX}"))}


def first_doc_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return doc.strip().splitlines()[0] if doc.strip() else "(no docstring)"


def _child_cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    last = lines[-1]
    return last if len(last) <= SUMMARY_CHARS else last[:SUMMARY_CHARS] + " [...]"


def record_run(name: str, script: Path, argv: Sequence[str]) -> dict:
    """Run the benchmark once with ``--output`` and return the record (see module doc)."""
    with tempfile.TemporaryDirectory(prefix="afd-bench-") as scratch:
        output = Path(scratch) / "result.json"
        command = [sys.executable, str(script), *argv, "--output", str(output)]
        load_before, cpu_before = os.getloadavg(), _child_cpu()
        started, date = time.monotonic(), datetime.now(timezone.utc)
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        load_after, cpu_after = os.getloadavg(), _child_cpu()
        result = json.loads(output.read_text()) if output.is_file() else None
    return {
        "benchmark": name,
        "command": f"pytest-afd bench --record {name} {' '.join(argv)}".rstrip(),
        "date": date.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpus": os.cpu_count(),
        "load_before": [round(value, 2) for value in load_before],
        "load_after": [round(value, 2) for value in load_after],
        "wall_s": round(wall, 2),
        "cpu_user_s": round(cpu_after[0] - cpu_before[0], 2),
        "cpu_system_s": round(cpu_after[1] - cpu_before[1], 2),
        "exit_status": completed.returncode,
        "summary": _last_line(completed.stdout) or _last_line(completed.stderr),
        "result": result,
    }


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="List, run and record the benchmarks in benchmarks/ by name, and render "
        "docs/benchmarks.md from the records. Benchmarks print JSON and a one-line summary "
        "with a met flag per target; speed targets live here, never in timed tests.",
    )
    parser.add_argument("name", nargs="?", metavar="NAME",
                        help="benchmark to run: benchmarks/NAME_bench.py (see --list)")
    parser.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="arguments passed to the benchmark unchanged")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--record", action="store_true",
                        help="store the run as benchmarks/results/NAME.json (with date, load "
                             "and CPU time) for docs/benchmarks.md")
    parser.add_argument("--docs", action="store_true",
                        help="render docs/benchmarks.md from benchmarks/results/*.json")
    parser.add_argument("--check", action="store_true",
                        help="with --docs: exit 1 if the page differs from what the records "
                             "give, writing nothing")
    parser.add_argument("--benchmarks-dir", type=Path, default=DEFAULT_BENCHMARKS,
                        help="where the *_bench.py files are (default: the checkout's "
                             "benchmarks/)")
    parser.add_argument("--docs-file", type=Path, default=DEFAULT_DOCS,
                        help="the page --docs writes (default: the checkout's "
                             "docs/benchmarks.md)")
    return parser


def _docs(args: argparse.Namespace, prog: str) -> int:
    from pytest_afd.cli.bench_docs import render_page

    page = render_page(args.benchmarks_dir / RESULTS)
    if args.check:
        current = args.docs_file.read_text() if args.docs_file.is_file() else ""
        if current != page:
            print(f"{prog}: {args.docs_file} is out of date: run '{prog} --docs'",
                  file=sys.stderr)
            return 1
        print(f"{args.docs_file} is up to date")
        return 0
    args.docs_file.write_text(page)
    print(args.docs_file)
    return 0


def run(argv: Sequence[str], prog: str) -> int:
    parser = _parser(prog)
    args = parser.parse_args(list(argv))
    if not args.benchmarks_dir.is_dir():
        parser.error(f"--benchmarks-dir {str(args.benchmarks_dir)!r}: no such directory "
                     "(the benchmarks ship with the source checkout, not the package)")
    if args.docs:
        return _docs(args, prog)
    names = benchmark_names(args.benchmarks_dir)
    if args.list or args.name is None:
        width = max(map(len, names), default=0)
        for name, path in names.items():
            print(f"{name:<{width}}  {first_doc_line(path)}")
        return 0
    if args.name not in names:
        parser.error(f"no benchmark {args.name!r} in {args.benchmarks_dir} "
                     f"(choose from {', '.join(names)})")
    if not args.record:
        return subprocess.run([sys.executable, str(names[args.name]), *args.args],
                              check=False).returncode
    record = record_run(args.name, names[args.name], args.args)
    target = args.benchmarks_dir / RESULTS / f"{args.name}.json"
    target.parent.mkdir(exist_ok=True)
    target.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"{record['summary']}\nrecorded: {target} ({record['wall_s']} s wall, "
          f"load {record['load_before'][0]} -> {record['load_after'][0]})")
    return record["exit_status"]
