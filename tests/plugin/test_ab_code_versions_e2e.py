"""End to end: ``--afd-ab-checkout DIR_A DIR_B`` runs each side on its own checkout's CPU server.

Slow (minutes on two cores): ``python3 -m pytest -m slow tests/plugin/test_ab_code_versions_e2e.py``.
The fast checks (flags, errors, alternation, evidence) are test_ab_sides.py and
suites/stage_a/test_stage_ab_sides.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.inner_pytest import UNRELATED_PLUGINS

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("pytest_afd", "afd_split", "schemas")
CLEARED = ("AFD_ASCEND_SERVER_URL", "AFD_ASCEND_SERVER_SETTINGS", "AFD_ASCEND_DEPLOYMENTS",
           "AFD_ASCEND_DEPLOY_COMMAND", "AFD_BACKEND", "AFD_REQUIRE_HARDWARE", "AFD_EVIDENCE_DIR",
           "AFD_STAGE_SCALE", "AFD_DEVICES_PER_NODE", "PYTEST_AFD_PERF_FAULT", "PYTEST_AFD_FAULT")
SELECTION = ["-m", "stage_a", "-k", "smallest", "suites/stage_a", "--afd-stage-scale", "1/256",
             "--afd-warmups", "0", "--afd-repeats", "3", "-p", "no:randomly"]
INTERRUPT_WAIT_S = 600
STOP_WAIT_S = 120


def copy_checkout(target: Path) -> Path:
    """A checkout of this code: its packages, without caches."""
    for name in PACKAGES:
        shutil.copytree(REPO / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def session(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    a, b = copy_checkout(tmp_path / "A"), copy_checkout(tmp_path / "B")
    (b / "pytest_afd" / "SIDE_B_MARKER").write_text("this checkout is side B\n")
    env = {key: value for key, value in os.environ.items() if key not in CLEARED}
    env.update(PYTHONPATH=str(REPO), AFD_CPU_DEPLOY_DIR=str(tmp_path / "state"))
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *UNRELATED_PLUGINS,
            *SELECTION, "--afd-results-dir", str(tmp_path / "results"),
            "--afd-ab-checkout", str(a), str(b)]
    return argv, env


def live_servers(state: Path) -> list[Path]:
    return sorted(state.glob("*.json")) if state.is_dir() else []


@pytest.mark.slow
def test_each_side_runs_its_own_checkout_alternately_and_no_server_is_left(tmp_path):
    argv, env = session(tmp_path)
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=3000,
                          check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " skipped" not in done.stdout.splitlines()[-1], done.stdout[-3000:]  # checks ran
    docs = [json.loads(path.read_text()) for path in (tmp_path / "results").rglob("*.json")]
    docs = [doc for doc in docs if isinstance(doc, dict) and doc.get("kind") == "afd-result"]
    sides = {"ab-A": tmp_path / "A", "ab-B": tmp_path / "B"}
    by_side = {side: [doc for doc in docs if doc["case_id"].endswith(side)] for side in sides}
    assert all(len(found) == len(by_side["ab-A"]) > 0 for found in by_side.values())
    for side, checkout in sides.items():
        for doc in by_side[side]:
            record = doc["evidence"]["ab_side"]
            assert record["checkout"] == str(checkout)
            # What the serving CPU server itself imported: this side's checkout, no other.
            assert record["served"]["code"]["pytest_afd"] == str(checkout / "pytest_afd")
            assert record["served"]["stand_in_device"] == "cpu"
            assert doc["manifest"]["hardware"]["emulated"] is True  # a stand-in, never hardware
            assert isinstance(doc["evidence"]["steps"], list) and doc["evidence"]["steps"]
    order = by_side["ab-A"][0]["protocol"]["executed_order"]
    assert [entry.rpartition("/")[2].split("#")[0] for entry in order[:4]] == [
        "ab-A", "ab-B", "ab-A", "ab-B"]
    assert "interleaved A/B: B / A" in done.stdout
    assert live_servers(tmp_path / "state") == [], "a side's server was left running"


@pytest.mark.slow
def test_ctrl_c_stops_both_sides_servers(tmp_path):
    argv, env = session(tmp_path)
    process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + INTERRUPT_WAIT_S
        while len(live_servers(tmp_path / "state")) < 2 and time.monotonic() < deadline:
            assert process.poll() is None, process.stdout.read()[-3000:]
            time.sleep(0.5)
        assert len(live_servers(tmp_path / "state")) >= 2, "both sides' servers never came up"
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=STOP_WAIT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode != 0
    assert live_servers(tmp_path / "state") == [], output[-3000:]

