"""Issue 23 row 4: a results dir on a full filesystem fails cleanly, never INTERNALERROR.

A test whose result cannot be written fails naming the cause; the summary.json
write that then fails is reported as "cannot write …: no space left on device"
after pytest's own summary line, and the session exits with
``EXIT_RESULTS_UNWRITABLE``. The start-up probe writes real bytes, so a disk
that is already full fails the session at start-up. ENOSPC is injected
(``os.replace`` raising it) in one run and real (a tiny tmpfs, where mounting
is allowed) in the others.
"""

import contextlib
import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from pytest_afd.plugin import EXIT_RESULTS_UNWRITABLE
from tests.support.fork_server import ForkServer
from tests.support.forked_pytest import PYTEST_TIMEOUT_S, runpytest_forked
from tests.support.plugin_pytester import AFD_ENV, FAKE_CONFTEST, FAST

pytest_plugins = ["pytester"]

TMPFS_BYTES = 256 * 1024
MOUNT_TIMEOUT_S = 30

INJECTED_ENOSPC = """
import errno
import os

_real_replace = os.replace


def _full_disk(src, dst, *args, **kwargs):
    if "afd-results" in str(dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
    return _real_replace(src, dst, *args, **kwargs)


def pytest_sessionstart(session):  # after the start-up probe: the disk fills mid-session
    os.replace = _full_disk
"""

ONE_CASE = """
def test_case(record_case):
    record_case()

def test_other():
    pass
"""

FILL_THEN_RECORD = """
import os

def _fill(directory):
    with open(os.path.join(directory, "filler"), "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"x" * 4096)
        except OSError:
            pass

def test_case(record_case, afd_options):
    _fill(afd_options.results_dir)
    record_case()
"""


@pytest.fixture
def fake(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_CLOSED_FILE", str(tmp_path / "closed.txt"))
    for name in AFD_ENV:
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(FAKE_CONFTEST + INJECTED_ENOSPC)
    return pytester


def _check_clean_failure(output: str, returncode: int, summary: Path) -> None:
    assert "INTERNALERROR" not in output and "Traceback" not in output, output
    assert f"afd: cannot write {summary}: no space left on device" in output, output
    assert "1 failed" in output  # pytest's own summary line is still printed
    assert returncode == EXIT_RESULTS_UNWRITABLE


def test_injected_enospc_fails_the_test_and_the_summary_cleanly(fork_server, fake):
    fake.makepyfile(test_full=ONE_CASE)
    result = runpytest_forked(fork_server, fake, *FAST)
    output = result.stdout.str() + result.stderr.str()
    summary = fake.path / "afd-results" / "summary.json"
    _check_clean_failure(output, result.ret, summary)
    assert "cannot write" in output and "result 'test_full.py::test_case' is lost" in output
    assert not summary.exists()


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 256 KiB tmpfs (root with mount rights only); unmounted afterwards."""
    mount_point = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs",
                              str(mount_point)], capture_output=True, text=True,
                             timeout=MOUNT_TIMEOUT_S, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root with mount rights): "
                    f"{mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], timeout=MOUNT_TIMEOUT_S, check=False)


def _session(fork_server: ForkServer, project: Path,
             results: Path) -> subprocess.CompletedProcess:
    """``python -m pytest`` in ``project`` (forked from the session's fork server)."""
    env = {key: value for key, value in os.environ.items() if key not in AFD_ENV}
    env["FAKE_CLOSED_FILE"] = str(project / "closed.txt")
    return fork_server.run_module(
        "pytest", [*FAST, "-p", "no:randomly", "--afd-results-dir", str(results)],
        cwd=project, env=env, timeout=PYTEST_TIMEOUT_S)


def _project(tmp_path: Path, test_source: str) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(FAKE_CONFTEST)
    (project / "test_full.py").write_text(test_source)
    return project


def test_a_disk_filled_during_the_session_fails_cleanly(fork_server, tmp_path, tiny_tmpfs):
    project = _project(tmp_path, FILL_THEN_RECORD)
    results = tiny_tmpfs / "afd-results"
    finished = _session(fork_server, project, results)
    output = finished.stdout + finished.stderr
    _check_clean_failure(output, finished.returncode, results / "summary.json")


def test_a_full_disk_fails_the_start_up_probe(fork_server, tmp_path, tiny_tmpfs):
    with open(tiny_tmpfs / "filler", "wb", buffering=0) as handle, \
            contextlib.suppress(OSError):
        while True:
            handle.write(b"x" * 4096)
    with pytest.raises(OSError) as full:
        (tiny_tmpfs / "probe").write_bytes(b"x" * 4096)
    assert full.value.errno == errno.ENOSPC
    project = _project(tmp_path, ONE_CASE)
    finished = _session(fork_server, project, tiny_tmpfs / "afd-results")
    assert finished.returncode == pytest.ExitCode.USAGE_ERROR
    assert "no space left on device" in finished.stderr, finished.stderr
    assert "Traceback" not in finished.stderr
