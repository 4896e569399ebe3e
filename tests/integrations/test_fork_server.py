"""The fork server behind the registration, drift and pytest-in-a-process cases
(tests/support/fork_server.py): each child really starts fresh, as ``python -c`` or
``python -m`` would, and a crashing, hanging or orphaned child still fails its case with
its output."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support.fork_server import FRESH_PACKAGES, STALE_EXIT_CODE, ForkServer
from tests.support.registration_standins import ROOT

REPORT_SCRIPT = r'''
import json, sys
fresh = sys.argv[-1].split(",")
print(json.dumps({"argv": sys.argv, "path": sys.path, "main": __name__,
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in fresh)}))
'''
SMALL_SERVER = {"preload": ()}
"""The failure cases need no torch: a server that preloads nothing starts in ~0.1 s."""
CLEAN_ENV = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


@pytest.fixture
def small_server():
    server = ForkServer(**SMALL_SERVER)
    yield server
    server.close()


def report(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_each_child_starts_without_the_packages_under_test_and_as_python_c(fork_server,
                                                                           tmp_path):
    """A child after one that loaded afd_split and the hook still has none of them (nor
    afd_plugin, vLLM or pytest) loaded, and sees what ``python -c`` with the same
    ``PYTHONPATH`` sees: the same argv and sys.path, run as ``__main__``."""
    assert {"afd_split", "afd_plugin", "vllm", "torch_npu", "pytest"} <= set(FRESH_PACKAGES)
    fresh = ",".join(FRESH_PACKAGES)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    loading = fork_server.run("import afd_split.hook.install, sys; "
                              "print('afd_split.hook.install' in sys.modules)", [], env=env,
                              timeout=60)
    assert loading.returncode == 0 and loading.stdout == "True\n", loading.stderr
    forked = report(fork_server.run(REPORT_SCRIPT, [fresh], env=env, timeout=60))
    assert forked["loaded"] == [] and forked["main"] == "__main__"
    started = report(subprocess.run([sys.executable, "-c", REPORT_SCRIPT, fresh],
                                    capture_output=True, text=True, env=env, timeout=60))
    assert forked["argv"] == started["argv"] and forked["path"] == started["path"]


def test_a_module_runs_as_python_m_in_its_working_directory(small_server, tmp_path):
    (tmp_path / "reporting.py").write_text(REPORT_SCRIPT)
    env = {**CLEAN_ENV, "PYTHONPATH": str(ROOT)}
    forked = report(small_server.run_module("reporting", ["x"], env=env, cwd=tmp_path,
                                            timeout=60))
    started = report(subprocess.run([sys.executable, "-m", "reporting", "x"], cwd=tmp_path,
                                    capture_output=True, text=True, env=env, timeout=60))
    assert forked == started and forked["path"][0] == str(tmp_path)


def test_a_package_loaded_in_the_server_fails_every_run_by_name():
    """Fault injection: a server that preloaded a module of its ``fresh`` list (here json,
    standing in for afd_split) runs no script; the run fails naming the module."""
    server = ForkServer(preload=("json",), fresh=("json",))
    try:
        done = server.run("print('ran')", [], env=CLEAN_ENV, timeout=60)
    finally:
        server.close()
    assert done.returncode == STALE_EXIT_CODE and done.stdout == ""
    assert "not a fresh process" in done.stderr and "'json'" in done.stderr


def test_a_crashing_child_returns_its_status_and_stderr(small_server):
    raised = small_server.run("raise ValueError('seam drifted')", [], env=CLEAN_ENV, timeout=60)
    assert raised.returncode == 1 and "ValueError: seam drifted" in raised.stderr
    exited = small_server.run("import sys; sys.exit('refused')", [], env=CLEAN_ENV, timeout=60)
    assert exited.returncode == 1 and exited.stderr == "refused\n"
    crashed = small_server.run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", [],
                               env=CLEAN_ENV, timeout=60)
    assert crashed.returncode == -signal.SIGSEGV
    assert report(small_server.run(REPORT_SCRIPT, ["json"], env=CLEAN_ENV, timeout=60))["argv"]


def test_a_hanging_child_is_killed_and_raises_timeout_with_its_output(small_server):
    hanging = ("import os, sys, time; print(os.getpid(), flush=True); "
               "print('stuck', file=sys.stderr, flush=True); time.sleep(600)")
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        small_server.run(hanging, [], env=CLEAN_ENV, timeout=1)
    assert timed_out.value.stderr == "stuck\n"
    with pytest.raises(ProcessLookupError):  # killed and reaped by the server
        os.kill(int(timed_out.value.output), 0)
    assert small_server.run("print('next')", [], env=CLEAN_ENV, timeout=60).stdout == "next\n"


def test_a_dead_server_fails_the_run_with_its_stderr_and_close_leaves_no_process():
    server = ForkServer(**SMALL_SERVER)
    with pytest.raises(RuntimeError, match="fork server gave no reply"):
        server.run("import os, signal; os.kill(os.getppid(), signal.SIGKILL)", [], env=CLEAN_ENV,
                   timeout=60)
    assert server.process.returncode == -signal.SIGKILL
    closing = ForkServer(**SMALL_SERVER)
    closing.run("pass", [], env=CLEAN_ENV, timeout=60)
    closing.close()
    assert closing.process.returncode == 0
