"""Results directories shared by concurrent pytest sessions: no session lands on another's result.

Two sessions may run on one ``--afd-results-dir`` at once (two CI jobs, a
developer rerunning a case while a sweep runs). The guarantees:

* Every claim of a result file, every outcome rewrite and every summary write
  happens under one ``flock`` on ``<dir>/.afd-results.lock``.
* A running session holds an exclusive ``flock`` on its lease
  ``<dir>/.afd-sessions/<session id>.lock`` (the controller, for its xdist
  workers too); the kernel drops it when the process dies, so "live" never
  outlasts the session.
* A case's result goes to its usual file (:func:`pytest_afd.results.documents.result_path`)
  unless that file holds the result of another session, live or finished; then
  it goes to ``<stem>-<digest>.<session id>.json``. A rerun into the same
  directory keeps the earlier session's results beside its own (``report``
  shows the latest session, ``--all-sessions`` / ``--a-session`` the others),
  and the terminal says which sessions' results were kept
  (:func:`kept_sessions_line`).
* The end-of-test outcome rewrite is a compare-and-swap on ``session_id``: a
  file that now holds another session's result is left alone (and reported).
* Each session's summary is kept at ``.afd-sessions/<session id>.summary.json``;
  ``summary.json`` is the summary of the session that finished last, listing
  only its own files and naming the sessions that were live beside it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import glob
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pytest_afd.results.documents import (
    ResultValidationError,
    atomic_write_json,
    result_path,
    write_result,
)

DIR_LOCK_NAME = ".afd-results.lock"
SESSIONS_DIR_NAME = ".afd-sessions"
LEASE_SUFFIX = ".lock"
SESSION_SUMMARY_SUFFIX = ".summary.json"
LOCK_FILE_MODE = 0o644
_SESSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


INTERRUPTED_SUMMARY_KEY = "interrupted"
"""The ``summary.json`` key of an interrupted session: written by the session
(:mod:`pytest_afd.run.interrupted`), read by the report; here, below both, so that neither
imports the other (the plugin must not load the report's plotting when pytest starts)."""


@contextlib.contextmanager
def results_dir_lock(directory: Path) -> Iterator[None]:
    """Exclusive ``flock`` on the directory's lock file for claims, rewrites and summaries."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / DIR_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
                 LOCK_FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _lease_path(directory: Path, session_id: str) -> Path:
    return directory / SESSIONS_DIR_NAME / f"{session_id}{LEASE_SUFFIX}"


def session_summary_path(directory: Path, session_id: str) -> Path:
    return directory / SESSIONS_DIR_NAME / f"{session_id}{SESSION_SUMMARY_SUFFIX}"


def session_is_live(directory: Path, session_id: Any) -> bool:
    """Whether a session with that id holds its lease in ``directory`` now."""
    if not isinstance(session_id, str) or not _SESSION_ID_PATTERN.match(session_id):
        return False
    try:
        fd = os.open(_lease_path(directory, session_id), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def live_sessions(directory: Path, *, besides: str) -> list[str]:
    """Other sessions holding a lease in ``directory`` (sorted ids)."""
    sessions = directory / SESSIONS_DIR_NAME
    if not sessions.is_dir():
        return []
    ids = [path.name.removesuffix(LEASE_SUFFIX) for path in sessions.glob(f"*{LEASE_SUFFIX}")]
    return sorted(i for i in ids if i != besides and session_is_live(directory, i))


class SessionLease:
    """The running session's claim on a results directory (held until :meth:`release`)."""

    def __init__(self, directory: Path, session_id: str) -> None:
        if not _SESSION_ID_PATTERN.match(session_id):
            raise ValueError(f"session id {session_id!r} is not a plain name")
        self.directory = directory
        self.session_id = session_id
        self.path = _lease_path(directory, session_id)
        self._fd = -1

    def acquire(self) -> SessionLease:
        """Take the lease (and drop leases of dead sessions) under the directory lock."""
        with results_dir_lock(self.directory):
            self.path.parent.mkdir(exist_ok=True)
            for stale in self.path.parent.glob(f"*{LEASE_SUFFIX}"):
                if not session_is_live(self.directory, stale.name.removesuffix(LEASE_SUFFIX)):
                    with contextlib.suppress(OSError):
                        stale.unlink()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, LOCK_FILE_MODE)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new file: never contended
            self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lease (idempotent); the file goes first, so no one sees it live after."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self._fd)
        self._fd = -1


def session_result_path(directory: Path, case_id: str, session_id: str) -> Path:
    """The session's own file for ``case_id``: used while another live session holds the usual one."""
    usual = result_path(directory, case_id)
    return usual.with_name(f"{usual.stem}.{session_id}.json")


def _owner(path: Path) -> Any:
    """``session_id`` of the document at ``path``; None when absent or unreadable."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return doc.get("session_id") if isinstance(doc, dict) else None


def write_claimed_result(directory: Path, doc: dict[str, Any]) -> Path:
    """Write ``doc`` to its usual file, or to its session's own file while another
    session's result (live or finished) is there: a rerun never replaces an earlier
    session's result. Claim and write are one step under the directory lock."""
    session_id, case_id = doc["session_id"], doc["case_id"]
    with results_dir_lock(directory):
        path = result_path(directory, case_id)
        if _owner(path) not in (None, session_id):
            path = session_result_path(directory, case_id, session_id)
        write_result(path, doc)
    return path


def restamp_outcome(directory: Path, path: Path, session_id: str,
                    outcome: dict[str, Any]) -> Any:
    """Set the outcome of this session's result at ``path``; compare-and-swap on the session.

    Returns None when rewritten, else the ``session_id`` the file holds now
    (another session's result, left as it is).
    """
    with results_dir_lock(directory):
        # Validated once, by write_result below, with the new outcome in place: validating
        # the read too doubled the cost of every case's re-stamp and guarded nothing more.
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            raise ResultValidationError(f"result file {path} holds no JSON object")
        if doc.get("session_id") != session_id:
            return doc.get("session_id")
        doc["outcome"] = outcome
        write_result(path, doc)
    return None


def write_session_summary(directory: Path, summary_name: str, summary: dict[str, Any]) -> Path:
    """This session's summary at its own path, then as ``summary_name``, under the lock."""
    session_id = summary["session_id"]
    with results_dir_lock(directory):
        own = session_summary_path(directory, session_id)
        concurrent = live_sessions(directory, besides=session_id)
        doc = {**summary, "session_summary": str(own), "concurrent_sessions": [
            {"session_id": other, "summary": str(session_summary_path(directory, other))}
            for other in concurrent]}
        atomic_write_json(own, doc)
        return atomic_write_json(directory / summary_name, doc)


def kept_sessions(directory: Path, case_ids: Iterable[str], session_id: str
                  ) -> dict[str, tuple[int, str]]:
    """Other sessions' results kept beside this session's for the same case ids:
    session id -> (how many, newest ``created_at``)."""
    found: dict[str, tuple[int, str]] = {}
    for case_id in sorted(set(case_ids)):
        usual = result_path(directory, case_id)
        for path in [usual, *sorted(directory.glob(f"{glob.escape(usual.stem)}.*.json"))]:
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError, RecursionError):
                continue
            other = doc.get("session_id") if isinstance(doc, dict) else None
            if other in (None, session_id) or doc.get("case_id") != case_id:
                continue
            count, newest = found.get(str(other), (0, ""))
            found[str(other)] = (count + 1, max(newest, str(doc.get("created_at") or "")))
    return found


def _clock(created_at: str) -> str:
    """``2026-12-07T06:41:09+00:00`` -> ``2026-12-07 06:41`` (the text as it is when unparsable)."""
    try:
        return dt.datetime.fromisoformat(created_at).strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return created_at or "an unknown time"


def kept_sessions_line(directory: Path, case_ids: Iterable[str], session_id: str) -> str | None:
    """``kept 17 results of session X from 2026-12-07 06:41 beside this session's ...``;
    None when no earlier session wrote the same cases into ``directory``."""
    kept = kept_sessions(directory, case_ids, session_id)
    if not kept:
        return None
    parts = [f"{count} result(s) of session {other} from {_clock(newest)}"
             for other, (count, newest) in sorted(kept.items(), key=lambda item: item[1][1])]
    return (f"kept {'; '.join(parts)} in {directory} beside this session's (nothing replaced): "
            "'python -m pytest_afd report' shows the latest session, --all-sessions or "
            "--a-session SESSION the others")
