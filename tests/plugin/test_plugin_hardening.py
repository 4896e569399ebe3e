"""Hardening of the plugin's session: a crashed xdist worker and bad option values.

Every bad value fails at start-up with a usage error that names the value and
where it came from (CLI flag, env variable, ini key or file), never INTERNALERROR.
"""

import json

import pytest
from test_plugin_pytester import FAKE_CONFTEST, FAST

pytest_plugins = ["pytester"]

AFD_ENV = ("AFD_NPU_TOPOLOGY", "AFD_BACKEND", "AFD_RESULTS_DIR", "AFD_REPEATS", "AFD_ROUTING",
           "AFD_REQUIRE_HARDWARE", "AFD_NUM_NODES", "AFD_PROFILE", "AFD_CPU_PROCESSES", "AFD_SEED",
           "AFD_WARMUPS", "AFD_TOPOLOGY_ALIASES", "AFD_DEVICES_PER_NODE", "AFD_GOLDEN_DIR",
           "FAKE_UNAVAILABLE")


@pytest.fixture
def fake(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_CLOSED_FILE", str(tmp_path / "closed.txt"))
    for name in AFD_ENV:
        monkeypatch.delenv(name, raising=False)
    pytester.makeconftest(FAKE_CONFTEST)
    return pytester


CRASH_USER = """
import os
import signal

import pytest

@pytest.mark.parametrize("n", range(3))
def test_a(record_case, n):
    record_case()

def test_c():
    os.kill(os.getpid(), signal.SIGKILL)

@pytest.mark.parametrize("n", range(3))
def test_z(record_case, n):
    record_case()
"""


def test_crashed_xdist_worker_fails_its_test_and_keeps_the_others_results(fake):
    fake.makepyfile(test_crash=CRASH_USER)
    result = fake.runpytest_subprocess(*FAST, "-n", "2", "-p", "xdist")
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    # xdist restarts the worker; the killed test is failed, every other test ran.
    result.assert_outcomes(passed=6, failed=1)
    result.stdout.fnmatch_lines(["*test_crash.py::test_c*", "*worker gw? crashed*"])
    summary = json.loads((fake.path / "afd-results" / "summary.json").read_text())
    [lost] = summary["lost_workers"]
    assert lost["worker"].startswith("gw")
    listed = {entry["case_id"] for entry in summary["results"]}
    on_disk = {json.loads(path.read_text())["case_id"]
               for path in (fake.path / "afd-results").glob("*.json") if path.name != "summary.json"}
    assert len(on_disk) == 6
    # Only results of the worker that died are missing from the summary, never a live worker's.
    assert listed <= on_disk and listed
    workers = {json.loads(open(e["path"]).read())["notes"] for e in summary["results"]}
    assert len(workers) >= 1
