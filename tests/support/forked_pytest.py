"""``pytester.runpytest_subprocess`` with the pytest process forked from the session's
ForkServer (tests/support/fork_server.py) instead of a new interpreter importing torch.

Same command line (``python -m pytest --basetemp=<new dir under pytester.path> *args``),
working directory (``pytester.path``), environment (the current one with ``pytester.path``
first on PYTHONPATH) and result type (``pytest.RunResult``); the child starts with no
pytest, pytest_afd or afd_split module loaded (the server checks it for every run).
"""

from __future__ import annotations

import os
import tempfile
import time

import pytest

from tests.support.fork_server import ForkServer

PYTEST_TIMEOUT_S = 300


def runpytest_forked(fork_server: ForkServer, pytester: pytest.Pytester, *args: str,
                     timeout: float = PYTEST_TIMEOUT_S) -> pytest.RunResult:
    """What ``pytester.runpytest_subprocess(*args)`` returns, from a forked child."""
    if pytester.plugins:
        raise ValueError(f"pytester.plugins={pytester.plugins!r}: pass plugins as -p arguments")
    basetemp = tempfile.mkdtemp(prefix="runpytest-", dir=pytester.path)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pytester.path),
                                                      env.get("PYTHONPATH", "")]))
    started = time.monotonic()
    done = fork_server.run_module("pytest", [f"--basetemp={basetemp}", *args], env=env,
                                  cwd=pytester.path, timeout=timeout)
    return pytest.RunResult(done.returncode, done.stdout.splitlines(), done.stderr.splitlines(),
                            time.monotonic() - started)
