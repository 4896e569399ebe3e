"""The seeded-fault (mutation) check: ``pytest -m gate`` must fail under every split-path fault.

For each fault of :mod:`pytest_afd.faults.registry` a ``pytest -m gate -x`` subprocess
runs on the CPU gates with ``$PYTEST_AFD_FAULT`` naming it (the gates'
conftest applies it for the whole session). The check passes when every one
of those runs FAILS with test failures (exit status 1); a run that passes
means the gates cannot see that fault class, and a usage / collection /
internal error (status 2-5) proves nothing, so both are reported as misses.

Speed: gate 1's glue-check and fault-injection modules run first (a split
or glue fault fails one of their cases within seconds), then the soak (the
leaks, which only gate 5 sees, fail within one soak); ``-x`` stops at the
first failure, which the report names per fault (``caught_by``: the gate
test that caught it). ``jobs`` > 1 runs that many
faults at once (only worth it with spare cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from pytest_afd.faults.registry import FAULT_ENV, FAULTS, get_fault

PYTEST_TESTS_FAILED = 1
DEFAULT_GATES_DIR = "suites/gates"
# Gate 1's glue checks and fault-injection module first (their cases fail within
# seconds under a glue or split fault), then gate 5, the only gate that sees the leaks.
FIRST_MODULES = ("test_gate_1_glue_checks.py", "test_gate_1_full_batch_kept.py",
                 "test_gate_1_fault_injection.py",
                 "test_gate_5_soak.py")
DEFAULT_TIMEOUT_S = 1800.0
OUTPUT_TAIL_CHARS = 2000


@dataclass
class FaultRun:
    """One fault's gate run."""

    fault: str
    returncode: int | None
    caught: bool
    seconds: float
    first_failure: str | None
    output_tail: str

    @property
    def caught_by(self) -> str | None:
        """The gate test whose failure caught the fault (its node id), when it was caught."""
        if not self.caught or self.first_failure is None:
            return None
        return self.first_failure.split(" ", 1)[1].split(" - ", 1)[0]


def gate_command(gates_dir: Path, results_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """``python -m pytest -m gate -x`` on the gates, the leak-seeing modules first."""
    modules = sorted(path.name for path in gates_dir.glob("test_*.py"))
    ordered = [m for m in FIRST_MODULES if m in modules] + [m for m in modules if m not in FIRST_MODULES]
    return [
        sys.executable, "-m", "pytest", "-m", "gate", "-x", "-q", "-p", "no:cacheprovider",
        "-p", "no:randomly", "--afd-results-dir", str(results_dir),
        *(str(gates_dir / m) for m in ordered), *extra,
    ]  # fmt: skip


def _first_failure(output: str) -> str | None:
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line
    return None


def run_fault(fault: str | None, gates_dir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S,
              extra: Sequence[str] = ()) -> FaultRun:
    """Run the gates under ``fault`` (None: the clean control run, which must pass)."""
    if fault is not None:
        get_fault(fault, source="fault-check --fault")
    env = {key: value for key, value in os.environ.items() if key != FAULT_ENV}
    if fault is not None:
        env[FAULT_ENV] = fault
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="afd-fault-check-") as results_dir:
        command = gate_command(gates_dir, Path(results_dir), extra)
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True,
                                  timeout=timeout_s, check=False)
            returncode, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as expired:
            returncode = None
            output = f"timed out after {timeout_s:g} s\n{expired.stdout or ''}"
    caught = returncode == PYTEST_TESTS_FAILED if fault is not None else returncode == 0
    return FaultRun(
        fault=fault or "control", returncode=returncode, caught=caught,
        seconds=time.monotonic() - started, first_failure=_first_failure(output),
        output_tail=output[-OUTPUT_TAIL_CHARS:],
    )  # fmt: skip


def fault_check(faults: Sequence[str] | None = None, *, gates_dir: str | Path = DEFAULT_GATES_DIR,
                jobs: int = 1, control: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S,
                extra: Sequence[str] = ()) -> list[FaultRun]:
    """One :class:`FaultRun` per fault (every registered one by default), plus the control."""
    names = list(faults) if faults else sorted(FAULTS)
    for name in names:
        get_fault(name, source="fault-check --fault")
    if jobs < 1:
        raise ValueError(f"fault-check --jobs={jobs}; expected >= 1")
    gates = Path(gates_dir)
    if not gates.is_dir():
        raise FileNotFoundError(f"fault-check --gates-dir {gates}: no such directory")
    targets: list[str | None] = [*names, *([None] if control else [])]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lambda f: run_fault(f, gates, timeout_s=timeout_s, extra=extra),
                             targets))


def main(args) -> int:
    """The ``fault-check`` subcommand: JSON per fault on stdout, exit 1 when one is missed."""
    extra = ("-k", args.select) if args.select else ()
    try:
        runs = fault_check(args.fault, gates_dir=args.gates_dir, jobs=args.jobs,
                           control=args.control, timeout_s=args.timeout, extra=extra)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missed = [run.fault for run in runs if not run.caught]
    summary = {
        "caught": [run.fault for run in runs if run.caught],
        "missed": missed,
        "caught_by": {run.fault: run.caught_by for run in runs},
        "runs": [{**{k: v for k, v in asdict(run).items() if k != "output_tail" or not run.caught},
                  "caught_by": run.caught_by} for run in runs],
    }
    print(json.dumps(summary, indent=2))
    for run in runs:  # the table: fault, outcome, the gate that caught it
        outcome = "caught" if run.caught else "MISSED"
        print(f"{run.fault:40} {outcome:7} {run.seconds:7.1f} s  {run.caught_by or '-'}",
              file=sys.stderr)
    return 1 if missed else 0


def add_parser(commands) -> None:
    check = commands.add_parser(
        "fault-check", help="assert `pytest -m gate` fails under every seeded split-path fault"
    )
    check.add_argument("--fault", action="append", choices=sorted(FAULTS),
                       help="only this fault (repeatable; default: all)")
    check.add_argument("--gates-dir", default=DEFAULT_GATES_DIR, help="default: %(default)s")
    check.add_argument("--jobs", type=int, default=1, help="faults run at once (default: 1)")
    check.add_argument("--control", action="store_true",
                       help="also run the gates without a fault: they must pass")
    check.add_argument("--select", metavar="EXPR",
                       help="only the gate tests pytest -k EXPR selects (e.g. afd_runtime: "
                            "gate 1's AFD-process cases); default: every gate")
    check.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                       help="seconds per gate run (default: %(default)s)")
