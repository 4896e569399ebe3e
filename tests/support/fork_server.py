"""Fresh Python processes without paying the interpreter's and torch's start-up per case.

The registration and drift tests need each case in a process that has never loaded
afd_split, afd_plugin or vLLM and whose ``sys.path`` starts with that case's stand-in tree
(what ``python -c SCRIPT`` with ``PYTHONPATH=tree:ROOT`` gives); the plugin tests that run
pytest in its own process need the same for pytest and pytest_afd. Most of such a
process's start-up is ``import torch`` (~1.1 s on this host). A :class:`ForkServer` is a
Python process that imports only third-party modules (torch, numpy) once and then
``os.fork()``s one child per :meth:`ForkServer.run` (``python -c``) or
:meth:`ForkServer.run_module` (``python -m``): the child takes the run's environment (its
PYTHONPATH entries on ``sys.path`` where the interpreter puts them), argv and working
directory, checks that no module of ``FRESH_PACKAGES`` is loaded (else it fails, naming
them), runs the script or module as ``__main__`` with its stdout/stderr captured and
exits. The result is a ``subprocess.CompletedProcess``; a child past its timeout is killed
and ``subprocess.TimeoutExpired`` raised with its output, as ``subprocess.run`` does.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path

PRELOADED = ("torch", "numpy")
"""What the server imports once: third-party only, never a package under test."""

FRESH_PACKAGES = ("afd_split", "afd_plugin", "pytest_afd", "tests", "suites", "vllm",
                  "vllm_ascend", "torch_npu", "pytest", "_pytest", "xdist", "hypothesis")
"""Top-level packages a child must start without; one loaded fails the run by name."""

STALE_EXIT_CODE = 3
"""A child's exit status when a FRESH_PACKAGES module was loaded before its script ran."""

REPLY_GRACE_S = 30.0
"""How much longer than a run's timeout the client waits for the server's reply."""

SHUTDOWN_WAIT_S = 10.0

SERVER_SCRIPT = r'''
import importlib, json, os, runpy, signal, sys, tempfile, time, traceback, types

# The protocol runs on private copies of stdin/stdout; fd 0 is /dev/null and fd 1 is
# stderr, so nothing a preloaded module prints can corrupt a reply.
requests = os.fdopen(os.dup(0), "r")
replies = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
os.dup2(2, 1)
preload, fresh, stale_exit = sys.argv[1].split(","), tuple(sys.argv[2].split(",")), int(sys.argv[3])
for name in filter(None, preload):
    importlib.import_module(name)
BASE_PATH = sys.path[1:]  # sys.path[0] is "" (python -c); the rest is the interpreter's
POLL_S = 0.005
running = []


def stop(signum, frame):
    for pid in running:
        os.kill(pid, signal.SIGKILL)
    os._exit(1)


signal.signal(signal.SIGTERM, stop)


def child(request, out, err):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's own handler is not the case's
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    requests.close()
    replies.close()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    module = request.get("module")
    sys.argv = ["-m" if module else "-c", *request["argv"]]
    # python -c puts "" first on sys.path, python -m the working directory.
    sys.path[:] = [os.getcwd() if module else "", *request["path"], *BASE_PATH]
    importlib.invalidate_caches()
    stale = sorted(name for name in sys.modules if name.split(".")[0] in fresh)
    if stale:
        sys.stderr.write(f"fork server: not a fresh process, already loaded: {stale}\n")
        sys.stderr.flush()
        os._exit(stale_exit)
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    code = 0
    try:
        if module:  # sets sys.argv[0] to the module's file, as -m does
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            exec(compile(request["script"], "<string>", "exec"), main.__dict__)
    except SystemExit as exit_:  # as the interpreter maps sys.exit(code)
        code = 0 if exit_.code is None else exit_.code
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException as error:  # the script's frames only, as python -c prints them
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run(request):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                child(request, out, err)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(70)
        running.append(pid)
        deadline = time.monotonic() + request["timeout"]
        timed_out = False
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                timed_out = True
                break
            time.sleep(POLL_S)
        running.remove(pid)
        out.seek(0)
        err.seek(0)
        return {"pid": pid, "returncode": os.waitstatus_to_exitcode(status),
                "timed_out": timed_out, "stdout": out.read().decode(errors="replace"),
                "stderr": err.read().decode(errors="replace")}


for line in requests:
    replies.write(json.dumps(run(json.loads(line))) + "\n")
    replies.flush()
'''


class ForkServer:
    """One server process (start it once per test session; each xdist worker gets its
    own); :meth:`run` forks a fresh child from it. Close it to end the server."""

    def __init__(self, preload: tuple[str, ...] = PRELOADED, *,
                 fresh: tuple[str, ...] = FRESH_PACKAGES,
                 env: dict[str, str] | None = None) -> None:
        # PYTHONPATH is unset for the server: each run sets its own path entries, as the
        # subprocess it replaces got them from its own PYTHONPATH.
        server_env = {key: value for key, value in (env or os.environ).items()
                      if key != "PYTHONPATH"}
        self._stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER_SCRIPT, ",".join(preload), ",".join(fresh),
             str(STALE_EXIT_CODE)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            env=server_env)

    def run(self, script: str, args: list[str], *, env: dict[str, str], timeout: float,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """``python -c script *args`` with ``env`` (its PYTHONPATH entries follow ``""`` on
        ``sys.path``) in ``cwd``, in a child forked from the server; past ``timeout``
        seconds the child is killed and ``subprocess.TimeoutExpired`` raised."""
        return self._request({"script": script}, ["-c", "<script>"], args, env, timeout, cwd)

    def run_module(self, module: str, args: list[str], *, env: dict[str, str], timeout: float,
                   cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """``python -m module *args`` (``sys.path[0]`` is ``cwd``), as :meth:`run`."""
        return self._request({"module": module}, ["-m", module], args, env, timeout, cwd)

    def _request(self, what: dict, shown: list[str], args: list[str], env: dict[str, str],
                 timeout: float, cwd: str | Path | None) -> subprocess.CompletedProcess:
        python_path = env.get("PYTHONPATH", "")
        request = {**what, "argv": [str(arg) for arg in args],
                   "path": [entry for entry in python_path.split(os.pathsep) if entry],
                   "env": dict(env), "cwd": str(cwd or os.getcwd()), "timeout": timeout}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout + REPLY_GRACE_S)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            server_stderr = self._server_stderr()
            self.close()
            raise RuntimeError(f"fork server gave no reply (exit status "
                               f"{self.process.returncode}); its stderr:\n{server_stderr}")
        reply = json.loads(line)
        command = [sys.executable, *shown, *request["argv"]]
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(command, timeout, reply["stdout"], reply["stderr"])
        return subprocess.CompletedProcess(command, reply["returncode"], reply["stdout"],
                                           reply["stderr"])

    def close(self) -> None:
        """End the server (and a child still running); waits for it to exit."""
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(SHUTDOWN_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.terminate()  # the server kills its running child first
                try:
                    self.process.wait(SHUTDOWN_WAIT_S)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        self.process.stdout.close()
        if not self.process.stdin.closed:
            self.process.stdin.close()
        self._stderr.close()

    def _server_stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")
