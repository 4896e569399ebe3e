"""A deploy command that starts the harness's own CPU server: ``AFD_ASCEND_DEPLOY_COMMAND`` on CPU.

It speaks the deploy-command protocol (docs/ascend.md "Deploy through your job
system") the way an ``sbatch`` wrapper would, so CI rehearses the nightly's
redeployments without NPUs::

    pytest-afd deploy-cpu up SETTINGS_JSON PLAN_JSON   # prints http://127.0.0.1:PORT
    pytest-afd deploy-cpu down URL

(``python -m pytest_afd.cli deploy-cpu`` where the console script is not on PATH;
the old ``python -m pytest_afd.serving.cpu_deploy`` still works for one release.)
``up`` starts ``pytest-afd serve --backend cpu`` for the
plan's topology and model with the settings (with ``AFD_PROFILE_KEEP_TRACES`` set,
as AFD runtime processes: a profiled rehearsal, docs/profiling.md), in its own session (it outlives
this command, as a batch job outlives ``sbatch``), waits for its port file and
prints the URL; the harness then waits for ``/health``. ``down`` stops the
process group recorded for that URL. State (pid, log) lives in
``$AFD_CPU_DEPLOY_DIR`` (default: ``afd-cpu-deployments`` under the system
temp dir). The server answers ``/afd/describe`` with device ``cpu``, so every
case it serves is labelled emulated.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

ENV_STATE_DIR = "AFD_CPU_DEPLOY_DIR"
ENV_KEEP_TRACES = "AFD_PROFILE_KEEP_TRACES"  # profiling.cpu_run's; read here, never imported
ENV_THREADS = "AFD_CPU_DEPLOY_THREADS"
ENV_BATCH_WINDOW = "AFD_CPU_DEPLOY_BATCH_WINDOW_S"
# A case's requests leave the client as one burst; on a loaded two-core host their
# arrivals can spread past the server's 20 ms default and split one run into
# several server batches, each planned apart. Half a second keeps a burst together
# far more often; it does not make the join of server steps to client requests
# exact (see docs/serving.md).
DEFAULT_BATCH_WINDOW_S = "0.5"
PORT_WAIT_S = 300.0
POLL_S = 0.1
STOP_WAIT_S = 15.0
PROG = "python -m pytest_afd.serving.cpu_deploy"  # the old name; pytest-afd deploy-cpu passes its own
DESCRIPTION = (
    "The deploy command the harness calls on CPU (AFD_ASCEND_DEPLOY_COMMAND): 'up' starts the "
    "harness's CPU server for a launch plan and prints its URL; 'down' stops it. State lives "
    f"in ${ENV_STATE_DIR} (default: afd-cpu-deployments under the system temp dir)."
)


def state_dir() -> Path:
    directory = Path(os.environ.get(ENV_STATE_DIR) or Path(tempfile.gettempdir()) / "afd-cpu-deployments")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def up(settings_file: Path, plan_file: Path) -> str:
    """Start one CPU server for the plan's topology/model with these settings; return its URL."""
    settings = json.loads(Path(settings_file).read_text())
    plan = json.loads(Path(plan_file).read_text())
    if os.environ.get(ENV_KEEP_TRACES):
        # A profiled rehearsal: Attention and FFN run as the AFD runtime's processes, so the
        # batches the harness marks instrumented write per-role traces into that directory.
        settings = {**settings, "afd_processes": True}
    directory = Path(tempfile.mkdtemp(prefix="deployment-", dir=state_dir()))
    port_file = directory / "port"
    threads = os.environ.get(ENV_THREADS, "1")
    argv = [sys.executable, "-m", "pytest_afd.cli", "serve", "--backend", "cpu",
            "--topology", plan["npu_topology"], "--model-name", plan["model"],
            "--results-dir", str(directory), "--port", "0", "--port-file", str(port_file),
            "--settings-json", json.dumps(settings),
            "--batch-window-s", os.environ.get(ENV_BATCH_WINDOW, DEFAULT_BATCH_WINDOW_S)]
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    with open(directory / "server.log", "wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + PORT_WAIT_S
    while not (port_file.is_file() and port_file.read_text().strip().isdigit()):
        if process.poll() is not None or time.monotonic() > deadline:
            tail = (directory / "server.log").read_text(errors="replace")[-800:]
            _stop(process.pid)
            raise RuntimeError(f"the CPU server did not start (exit {process.poll()}): {tail}")
        time.sleep(POLL_S)
    port = int(port_file.read_text().strip())
    (state_dir() / f"{port}.json").write_text(json.dumps({"pid": process.pid,
                                                          "dir": str(directory)}))
    return f"http://127.0.0.1:{port}"


def _group_has_live_process(pgid: int) -> bool:
    """Whether any process of the group still runs. A server that exited stays a zombie
    until whoever adopted it reaps it (``up`` has exited; some init processes reap only
    every few seconds): it holds no port or memory, so it counts as stopped."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    proc = Path("/proc")
    if not proc.is_dir():  # no process table to read: the group exists, so it runs
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError):
            continue  # exited while we read
        if int(group) == pgid and state not in ("Z", "X"):
            return True
    return False


def _stop(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        if not _group_has_live_process(pid):
            return
        time.sleep(POLL_S)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def down(url: str) -> None:
    port = urlsplit(url).port
    record = state_dir() / f"{port}.json"
    if not record.is_file():
        raise RuntimeError(f"no CPU deployment recorded for {url} in {state_dir()}")
    _stop(int(json.loads(record.read_text())["pid"]))
    record.unlink()


def _build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION",
                                    help="up or down")
    start = actions.add_parser("up", help="start a CPU server for a plan; print its URL",
                               description="Start the harness's CPU server for the plan's "
                               "topology and model with these settings and print its URL.")
    start.add_argument("settings", type=Path, metavar="SETTINGS_JSON",
                       help="the case's RunSettings as a JSON file")
    start.add_argument("plan", type=Path, metavar="PLAN_JSON",
                       help="the launch plan as a JSON file (npu_topology and model are read)")
    stop = actions.add_parser("down", help="stop the server recorded for a URL",
                              description="Stop the process group 'up' recorded for URL.")
    stop.add_argument("url", metavar="URL", help="the URL 'up' printed")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """``pytest-afd deploy-cpu`` (``prog``) and the old ``python -m ...serving.cpu_deploy``."""
    args = _build_parser(prog).parse_args(argv)
    try:
        if args.action == "up":
            print(up(args.settings, args.plan), flush=True)
        else:
            down(args.url)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        sys.stderr.write(f"{prog}: {error}\n")
        return 1
    return 0


if __name__ == "__main__":
    from pytest_afd.cli.aliases import warn

    warn("python -m pytest_afd.serving.cpu_deploy", "pytest-afd deploy-cpu")
    sys.exit(main())
