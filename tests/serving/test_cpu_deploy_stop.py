"""``cpu_deploy down``: a server group counts as stopped once no member runs (zombies do not)."""

import os
import signal
import subprocess
import sys

from pytest_afd.serving.cpu_deploy import _group_has_live_process

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_running_group_is_live_and_its_unreaped_zombie_is_not():
    process = subprocess.Popen(SLEEP, start_new_session=True)
    try:
        assert _group_has_live_process(process.pid)
        process.kill()
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        assert not _group_has_live_process(process.pid)
    finally:
        process.kill()
        process.wait()
    assert not _group_has_live_process(process.pid)  # reaped: the group is gone


def test_a_stopped_member_still_counts_as_live():
    process = subprocess.Popen(SLEEP, start_new_session=True)
    try:
        os.kill(process.pid, signal.SIGSTOP)  # it holds its port and memory, it is not stopped
        assert _group_has_live_process(process.pid)
    finally:
        process.kill()
        process.wait()
