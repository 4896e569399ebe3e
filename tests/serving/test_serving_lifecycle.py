"""Server lifecycle on loopback: bounded, clear failures and no orphans.

Covers a server that never becomes healthy, one that exits during startup,
Ctrl-C and a killed harness while waiting, and the real CPU server dying in the
middle of a client run.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_afd.core.backend import PromptRequest, RunSettings
from pytest_afd.serving.client import Arrival, CompletionsClient
from pytest_afd.serving.http_backend import cpu_server_spec
from pytest_afd.serving.lifecycle import (
    ManagedServer,
    ServerExitedError,
    ServerGroup,
    ServerSpec,
    ServerStartupError,
)
from pytest_afd.serving.prometheus import parse_prometheus, sum_metric

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

UNUSED_PORT = 9  # discard port: nothing listens on loopback
WAIT_S = 20.0

# Prints its pid (and a grandchild's) then sleeps: a server stuck loading weights.
SLEEPER = (
    "import os, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    "print(f'pid={os.getpid()} grandchild={child.pid} loading weights...', flush=True)\n"
    "time.sleep(600)\n"
)


def alive(pid):
    """True unless the process is gone or a zombie (an unreaped corpse is not running)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_gone(*pids, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def pids_from_log(path, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and "grandchild=" in path.read_text():
            words = dict(word.split("=") for word in path.read_text().split() if "=" in word)
            return int(words["pid"]), int(words["grandchild"])
        time.sleep(0.05)
    raise AssertionError(f"no pids in {path}")


def sleeper_spec(timeout):
    return ServerSpec(name="sleeper", argv=(sys.executable, "-c", SLEEPER), port=UNUSED_PORT,
                      startup_timeout_s=timeout, stop_timeout_s=2.0)


def test_never_healthy_server_times_out_and_leaves_nothing(tmp_path):
    server = ManagedServer(sleeper_spec(timeout=2.0), tmp_path)
    started = time.monotonic()
    with pytest.raises(ServerStartupError) as raised:
        server.start()
    elapsed = time.monotonic() - started
    assert elapsed < 2.0 + 2 * 2.0 + 1.0  # timeout + TERM grace (+ KILL) + slack
    message = str(raised.value)
    assert "did not become healthy at 127.0.0.1:9/health within 2.0 s" in message
    assert "loading weights" in message and str(server.log_path) in message
    pid, grandchild = pids_from_log(server.log_path)
    assert wait_gone(pid, grandchild), "server or its worker outlived the failed start"


def test_server_exiting_during_startup_fails_fast_with_its_log(tmp_path):
    spec = ServerSpec(name="crasher", port=UNUSED_PORT, startup_timeout_s=60.0, argv=(
        sys.executable, "-c", "import sys; print('unrecognized argument --bogus'); sys.exit(3)"))
    started = time.monotonic()
    with pytest.raises(ServerStartupError, match="exited with code 3 during startup") as raised:
        ManagedServer(spec, tmp_path).start()
    assert time.monotonic() - started < 10.0
    assert "unrecognized argument --bogus" in str(raised.value)


def test_group_stops_every_member_when_one_fails(tmp_path):
    crasher = ServerSpec(name="ffn", port=UNUSED_PORT, startup_timeout_s=60.0,
                         argv=(sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(4)"))
    group = ServerGroup([sleeper_spec(timeout=60.0), crasher], tmp_path)
    with pytest.raises(ServerStartupError, match=r"a server it starts with failed.*'ffn'.*code 4"):
        group.start()
    pid, grandchild = pids_from_log(tmp_path / "sleeper.log")
    assert wait_gone(pid, grandchild)


HARNESS = (
    "import faulthandler, signal, sys\n"
    "faulthandler.register(signal.SIGUSR1)  # the test dumps the stack if this hangs\n"
    # Shells start background jobs with SIGINT ignored and Python then installs no
    # KeyboardInterrupt handler (pytest run as `cmd &` hung here): be the terminal's harness.
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "from pathlib import Path\n"
    "from pytest_afd.serving.lifecycle import ManagedServer, ServerSpec\n"
    "spec = ServerSpec(name='sleeper', argv=(sys.executable, '-c', sys.argv[2]), port=9,\n"
    "                  startup_timeout_s=600.0, stop_timeout_s=2.0)\n"
    "ManagedServer(spec, Path(sys.argv[1])).start()\n"
)


@pytest.mark.parametrize("how", ["ctrl_c", "harness_killed"])
def test_interrupted_harness_leaves_no_server(tmp_path, how):
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(tmp_path), SLEEPER],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    grandchild = None
    try:
        pid, grandchild = pids_from_log(tmp_path / "sleeper.log")
        harness.send_signal(signal.SIGINT if how == "ctrl_c" else signal.SIGKILL)
        try:
            harness.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            status = Path(f"/proc/{harness.pid}/status").read_text()  # state, signal masks
            signals = [line for line in status.splitlines() if line.startswith(("State", "Sig"))]
            harness.send_signal(signal.SIGUSR1)  # faulthandler: where it hangs
            time.sleep(1.0)
            harness.kill()
            output = harness.communicate()[0].decode(errors="replace")
            pytest.fail(f"the harness did not exit within {WAIT_S} s of {how} ({signals}):\n{output}")
        assert wait_gone(pid), f"server {pid} survived {how}"
        if how == "ctrl_c":  # the whole process group is stopped, workers included
            assert wait_gone(grandchild)
            assert b"KeyboardInterrupt" in harness.stdout.read()
    finally:
        harness.kill()
        harness.wait()
        # A SIGKILLed harness cannot stop the group: the server gets SIGTERM from
        # the kernel, and stopping its workers is then the server's job (vLLM does
        # it); this test's sleeper does not, so remove its worker here.
        if how == "harness_killed" and grandchild is not None and alive(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_server_dying_mid_run_fails_the_rest_quickly(tmp_path):
    settings = RunSettings(block_size=16, return_logits=False)
    spec = cpu_server_spec(settings, name="doomed", log_dir=tmp_path, topology="dp3pcp8-ep8",
                           model_name="reduced", seed=0)
    server = ManagedServer(spec, tmp_path).start()
    try:
        client = CompletionsClient(server.base_url, "reduced", request_timeout_s=60.0)
        small = PromptRequest("small", tuple(range(1, 33)))
        assert client.complete(small).success
        large = PromptRequest("large", tuple(i % 2000 + 1 for i in range(2000)))
        late = [PromptRequest(f"late{i}", (1, 2, 3)) for i in range(2)]
        # The late requests are due after 30 s; the run must end long before that.
        arrival = Arrival.trace([0.0, 30.0, 30.0])
        outcome = {}
        thread = threading.Thread(target=lambda: outcome.update(
            run=client.run([large, *late], arrival, read_metrics=False,
                           server_gone=server.exit_reason)))
        started = time.monotonic()
        thread.start()
        deadline = time.monotonic() + 60.0
        while time.monotonic() < deadline:  # kill while `large` is queued or being prefilled
            samples = parse_prometheus(client.get_text("/metrics"))
            busy = (sum_metric(samples, ("vllm:num_requests_running",)) or 0) + (
                sum_metric(samples, ("vllm:num_requests_waiting",)) or 0)
            if busy >= 1:
                break
            time.sleep(0.02)
        os.kill(server.pid, signal.SIGKILL)
        thread.join(timeout=WAIT_S)
        assert not thread.is_alive(), "client hung after the server died"
        assert time.monotonic() - started < 30.0
        results = {r.request_id: r for r in outcome["run"].results}
        assert not results["large"].success and results["large"].error
        for name in ("late0", "late1"):
            assert results[name].error.startswith("not sent: server 'doomed'")
            assert "exited with code -9" in results[name].error
        with pytest.raises(ServerExitedError, match="exited with code -9"):
            server.check_alive()
    finally:
        server.stop()
    assert not alive(server.pid)
