"""Issue 23 row 1: two pytest sessions on one results dir never land on each other's results.

Two real pytest processes run the same case on one ``--afd-results-dir``,
synchronized by files (no sleeps that decide anything): A writes its result and
waits; B writes, fails and finishes; then A passes. Before the fix the one file
held B's session and measurements with A's outcome, and summary.json pointed
at it. Now each result holds its own session's outcome, and each summary lists
only its own session's files.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_afd.report.loading import load_results
from pytest_afd.results.shared import (
    SESSIONS_DIR_NAME,
    SessionLease,
    kept_sessions,
    kept_sessions_line,
    live_sessions,
    restamp_outcome,
    session_is_live,
    write_claimed_result,
)
from tests.support.inner_pytest import UNRELATED_PLUGINS
from tests.support.plugin_pytester import AFD_ENV, FAKE_CONFTEST
from tests.support.result_data import PROTOCOL, make_outputs

SESSION_TIMEOUT_S = 300
ROOT = Path(__file__).resolve().parents[2]
CASE_ID = "test_shared.py::test_case"

SHARED_CASE = """
import os
import time
from pathlib import Path

WAIT_BOUND_S = 120  # generous: only a hung peer session reaches it


def _wait_for(path):
    deadline = time.monotonic() + WAIT_BOUND_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_case(record_case):
    sync, role = Path(os.environ["SYNC_DIR"]), os.environ["SESSION_ROLE"]
    if role == "B":
        _wait_for(sync / "a-wrote")
    record_case()
    if role == "A":
        (sync / "a-wrote").touch()
        _wait_for(sync / "b-done")
    else:
        assert False, "session B fails after writing its result"
"""


def _session(project: Path, results: Path, sync: Path, role: str) -> subprocess.Popen:
    env = {key: value for key, value in os.environ.items() if key not in AFD_ENV}
    env.update(SYNC_DIR=str(sync), SESSION_ROLE=role, FAKE_CLOSED_FILE=str(sync / "closed"))
    # This checkout's pytest_afd, not whichever one is installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
         *UNRELATED_PLUGINS, "--afd-results-dir", str(results), "test_shared.py"],
        cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process: subprocess.Popen) -> tuple[int, str]:
    try:
        output, _ = process.communicate(timeout=SESSION_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"a session did not finish within {SESSION_TIMEOUT_S}s:\n{output}")
    return process.returncode, output


def test_two_sessions_on_one_results_dir_keep_their_own_outcomes(tmp_path):
    project, results, sync = tmp_path / "project", tmp_path / "results", tmp_path / "sync"
    for directory in (project, sync):
        directory.mkdir()
    (project / "conftest.py").write_text(FAKE_CONFTEST)
    (project / "test_shared.py").write_text(SHARED_CASE)
    session_a = _session(project, results, sync, "A")
    session_b = _session(project, results, sync, "B")
    code_b, out_b = _finish(session_b)
    (sync / "b-done").touch()
    code_a, out_a = _finish(session_a)
    assert code_b == 1 and "1 failed" in out_b, out_b
    assert code_a == 0 and "1 passed" in out_a, out_a

    docs = {path: json.loads(path.read_text()) for path in results.glob("*.json")
            if path.name != "summary.json"}
    assert len(docs) == 2  # one result per session: neither was overwritten
    summary = json.loads((results / "summary.json").read_text())  # A finished last
    by_session = {doc["session_id"]: (path, doc) for path, doc in docs.items()}
    path_a, doc_a = by_session.pop(summary["session_id"])
    [(path_b, doc_b)] = by_session.values()
    assert doc_a["outcome"]["status"] == "passed" and doc_b["outcome"]["status"] == "failed"
    assert doc_a["session_id"] != doc_b["session_id"]
    assert doc_a["case_id"] == doc_b["case_id"] == CASE_ID

    assert [(e["path"], e["outcome"]) for e in summary["results"]] == [(str(path_a), "passed")]
    summary_b = json.loads(Path(summary["session_summary"]).parent.joinpath(
        f"{doc_b['session_id']}.summary.json").read_text())
    assert [(e["path"], e["outcome"]) for e in summary_b["results"]] == [(str(path_b), "failed")]
    assert [s["session_id"] for s in summary_b["concurrent_sessions"]] == [doc_a["session_id"]]
    assert not session_is_live(results, doc_a["session_id"])  # leases end with the sessions
    assert list((results / SESSIONS_DIR_NAME).glob("*.lock")) == []
    loaded = load_results(results)  # the report sees both results, not the bookkeeping
    assert sorted(r.path for r in loaded.results) == sorted([path_a, path_b])
    assert [p.name for p in loaded.ignored] == ["summary.json"]


def _doc(session_id: str, note: str) -> dict:
    from pytest_afd.core.backend import RunSettings
    from pytest_afd.results import documents as results
    from pytest_afd.results.manifest import collect_manifest
    from pytest_afd.stats.repetitions import run_repeated
    from pytest_afd.topology.spec import parse_topology

    manifest = collect_manifest(topology=parse_topology("dp1tp1-ep1"), backend_name="cpu",
                                backend_description={}, model_name="reduced", protocol=PROTOCOL,
                                emulated=True)
    outputs = make_outputs()
    doc = results.build_result(
        case_id=CASE_ID, case_kind="other", backend="cpu", settings=RunSettings(),
        manifest=manifest, protocol=run_repeated({"x": lambda: 1.0}).protocol_json(),
        workload=results.workload_json(dataset_name="fixed", prompt_lengths=[100, 60, 40],
                                       seed=None),
        metrics=results.metrics_from_runs([outputs]),
        evidence=results.evidence_from_outputs(outputs, routing="natural", num_ep_ranks=1),
        notes=note)
    return {**doc, "session_id": session_id, "outcome": {"status": "error", "reason": "running"}}


def test_a_rewrite_of_a_file_another_session_replaced_is_refused(tmp_path):
    """The compare-and-swap itself: a file that now holds another session's result."""
    from pytest_afd.results import documents as results

    path = results.result_path(tmp_path, CASE_ID)
    results.write_result(path, _doc("later", "second"))
    assert restamp_outcome(tmp_path, path, "earlier", {"status": "passed", "reason": None}) == (
        "later")
    assert json.loads(path.read_text())["outcome"]["status"] == "error"  # untouched
    later = SessionLease(tmp_path, "later").acquire()
    assert live_sessions(tmp_path, besides="nobody") == ["later"]
    later.release()
    assert live_sessions(tmp_path, besides="nobody") == []


def test_a_restamp_of_a_file_that_no_longer_matches_the_schema_writes_nothing(tmp_path):
    """The re-stamp reads without validating; its write validates the whole document, so a
    file damaged since it was written is refused there and left as it is."""
    from pytest_afd.results import documents as results

    path = results.result_path(tmp_path, CASE_ID)
    results.write_result(path, _doc("mine", "first"))
    damaged = json.loads(path.read_text())
    damaged["case_kind"] = "no_such_kind"
    path.write_text(json.dumps(damaged))
    with pytest.raises(results.ResultValidationError, match="case_kind"):
        restamp_outcome(tmp_path, path, "mine", {"status": "passed", "reason": None})
    assert json.loads(path.read_text()) == damaged
    path.write_text("[]")
    with pytest.raises(results.ResultValidationError, match="no JSON object"):
        restamp_outcome(tmp_path, path, "mine", {"status": "passed", "reason": None})


def test_a_rerun_keeps_a_finished_sessions_result_and_says_so(tmp_path):
    """Issue 40 finding 4: a later session used to replace a finished session's file."""
    earlier = SessionLease(tmp_path, "earlier").acquire()
    first = write_claimed_result(tmp_path, _doc("earlier", "first"))
    earlier.release()  # finished
    later = SessionLease(tmp_path, "later").acquire()
    second = write_claimed_result(tmp_path, _doc("later", "second"))
    later.release()
    assert second != first
    assert json.loads(first.read_text())["session_id"] == "earlier"
    assert json.loads(second.read_text())["session_id"] == "later"
    assert kept_sessions(tmp_path, [CASE_ID], "later") == {
        "earlier": (1, json.loads(first.read_text())["created_at"])}
    line = kept_sessions_line(tmp_path, [CASE_ID], "later")
    assert line.startswith("kept 1 result(s) of session earlier from ")
    assert kept_sessions_line(tmp_path, ["other.py::case"], "later") is None
    # A third session keeps both earlier ones.
    third = write_claimed_result(tmp_path, _doc("third", "third"))
    assert len({first, second, third}) == 3
    assert sorted(kept_sessions(tmp_path, [CASE_ID], "third")) == ["earlier", "later"]
    loaded = load_results(tmp_path)
    assert sorted(r.session for r in loaded.results) == ["earlier", "later", "third"]
    assert [r.session for r in load_results(tmp_path, session="earlier").results] == ["earlier"]


RERUN_CASE = """
def test_case(record_case):
    record_case()
"""


def test_a_rerun_into_the_same_results_dir_keeps_both_sessions(tmp_path):
    """Two real sessions one after the other: both sessions' results stay, the second
    session's terminal names what it kept, and compare can pick either session."""
    project, results = tmp_path / "project", tmp_path / "results"
    project.mkdir()
    (project / "conftest.py").write_text(FAKE_CONFTEST)
    (project / "test_shared.py").write_text(RERUN_CASE)
    sync = tmp_path / "sync"
    sync.mkdir()
    code_1, out_1 = _finish(_session(project, results, sync, "A"))
    code_2, out_2 = _finish(_session(project, results, sync, "A"))
    assert code_1 == 0 and code_2 == 0, out_1 + out_2
    docs = [json.loads(path.read_text()) for path in results.glob("*.json")
            if path.name != "summary.json"]
    sessions = sorted({doc["session_id"] for doc in docs})
    assert len(docs) == 2 and len(sessions) == 2  # the rerun replaced nothing
    assert "result(s) of session" not in out_1
    summary = json.loads((results / "summary.json").read_text())
    [earlier] = [s for s in sessions if s != summary["session_id"]]
    assert f"kept 1 result(s) of session {earlier} from " in out_2, out_2
    assert {r.session for r in load_results(results).results} == set(sessions)
    assert [r.session for r in load_results(results, latest_only=True).results] == [
        summary["session_id"]]
