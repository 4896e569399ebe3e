"""Loading a results directory: valid results, skipped files with the reason, sessions.

Every ``*.json`` under the directory is read as UTF-8 JSON and, when its
``kind`` is ``afd-result``, validated against ``schemas/result.schema.json``.
A file that cannot be used (not UTF-8, not JSON, nested too deeply, invalid)
is listed with the reason, never fatal: one bad file must not hide the rest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_afd.manifest import stack_digest, with_run
from pytest_afd.results import ResultValidationError, validate_result
from pytest_afd.shared_results import SESSIONS_DIR_NAME

REPORT_DIR_NAME = "report"
RESULT_KIND = "afd-result"
# Outcome fields (recorded by the plugin since sessions were introduced).
OUTCOME_KEY = "outcome"
SESSION_KEY = "session_id"
UNKNOWN_OUTCOME = "unknown"  # results written before outcomes were recorded
# Verdict order of the tables: what needs attention first.
VERDICT_ORDER = ("failed", "error", UNKNOWN_OUTCOME, "skipped", "passed")
LEGACY_SESSION_LABEL = "legacy (no session id)"
REASON_LINES = 2


@dataclass(frozen=True)
class LoadedResult:
    path: Path | None
    doc: Mapping[str, Any]

    @property
    def case_id(self) -> str:
        return self.doc["case_id"]

    @property
    def stage(self) -> str:
        return self.doc["case_kind"]

    @property
    def digest(self) -> str:
        return self.doc["manifest_digest"]

    @property
    def stack(self) -> str:
        """The stack's digest: the manifest without the per-case run keys (routing, quantization, block size)."""
        return stack_digest(self.doc["manifest"])

    @property
    def policy(self) -> str:
        return self.doc["settings"]["split_policy"]

    @property
    def dataset(self) -> str:
        return self.doc["workload"]["dataset"]["name"]

    @property
    def status(self) -> str:
        """passed / failed / error / skipped, or "unknown" for a result without an outcome."""
        outcome = self.doc.get(OUTCOME_KEY)
        return outcome["status"] if outcome else UNKNOWN_OUTCOME

    @property
    def reason(self) -> str | None:
        outcome = self.doc.get(OUTCOME_KEY)
        return outcome.get("reason") if outcome else None

    @property
    def session(self) -> str | None:
        """The writing session's id; None for results from before sessions were recorded."""
        return self.doc.get(SESSION_KEY)


@dataclass
class LoadedResults:
    results: list[LoadedResult] = field(default_factory=list)
    # (file, reason) for files that could not be used.
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    # JSON that is not a result (the session summary, manifests): named, not an error.
    ignored: list[Path] = field(default_factory=list)
    # Results left out by the session filter (see select_latest_session).
    earlier: list[LoadedResult] = field(default_factory=list)
    # How many results predate run identities and sessions (read through legacy_view).
    legacy: int = 0


def read_json(path: Path) -> Any:
    """The parsed file; ValueError with a one-line reason when it is not usable JSON."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ValueError(f"unreadable: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"unreadable JSON: {exc}") from None
    except RecursionError:
        raise ValueError("unreadable JSON: nested too deeply to parse") from None


def _validation_reason(doc: Mapping[str, Any]) -> str | None:
    try:
        validate_result(doc)
    except ResultValidationError as exc:
        return " ".join(line.strip() for line in str(exc).splitlines()[:REASON_LINES])
    except RecursionError:
        return "result nested too deeply to validate"
    return None


RUN_SECTION = "run"


def legacy_view(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """A result from before run identities and sessions, with its run identity filled in.

    Such results have no ``session_id``, no ``outcome`` and no ``manifest.run``;
    the run identity is derived from the manifest and settings they do carry
    (the digest is recomputed), so they still group into stacks. None for a
    document that is not of that vintage.
    """
    manifest = doc.get("manifest")
    if SESSION_KEY in doc or OUTCOME_KEY in doc or not isinstance(manifest, Mapping):
        return None
    if RUN_SECTION in manifest or not isinstance(doc.get("settings"), Mapping):
        return None
    upgraded = with_run(manifest, doc["settings"])
    return {**doc, "manifest": upgraded, "manifest_digest": upgraded["digest"]}


def load_results(results_dir: Path, *, exclude: Path | None = None) -> LoadedResults:
    """Every valid result under ``results_dir``, except files under ``exclude`` (the report)
    and the sessions' bookkeeping (``.afd-sessions``: leases and per-session summaries)."""
    loaded = LoadedResults()
    report_dir = (exclude or results_dir / REPORT_DIR_NAME).resolve()
    sessions_dir = (results_dir / SESSIONS_DIR_NAME).resolve()
    for path in sorted(results_dir.rglob("*.json")):
        parents = path.resolve().parents
        if report_dir in parents or sessions_dir in parents or not path.is_file():
            continue
        try:
            doc = read_json(path)
        except ValueError as exc:
            loaded.skipped.append((path, str(exc)))
            continue
        if not isinstance(doc, dict) or doc.get("kind") != RESULT_KIND:
            loaded.ignored.append(path)
            continue
        reason = _validation_reason(doc)
        if reason is not None:
            try:
                upgraded = legacy_view(doc)
            except (TypeError, KeyError, AttributeError, ValueError):
                upgraded = None
            if upgraded is None or _validation_reason(upgraded) is not None:
                loaded.skipped.append((path, reason))
                continue
            doc = upgraded
            loaded.legacy += 1
        loaded.results.append(LoadedResult(path=path, doc=doc))
    return loaded


def latest_session(results: Sequence[LoadedResult]) -> str | None:
    """The session of the newest result (``created_at``); None when that is a legacy result."""
    newest = max(results, key=lambda r: r.doc["created_at"])
    return newest.session


def select_latest_session(loaded: LoadedResults) -> LoadedResults:
    """Keep the latest session's results; the others move to ``earlier``."""
    if not loaded.results:
        return loaded
    latest = latest_session(loaded.results)
    kept = [r for r in loaded.results if r.session == latest]
    earlier = [r for r in loaded.results if r.session != latest]
    return LoadedResults(kept, loaded.skipped, loaded.ignored, earlier, loaded.legacy)


def session_label(session: str | None) -> str:
    return LEGACY_SESSION_LABEL if session is None else session


def verdict_rank(result: LoadedResult) -> int:
    status = result.status
    return VERDICT_ORDER.index(status) if status in VERDICT_ORDER else 0
