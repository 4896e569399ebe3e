"""Loading a results directory: valid results, skipped files with the reason, sessions.

Every ``*.json`` under the directory is scanned (pytest_afd.report.scan: kind,
session, creation time, cached by file identity); the chosen sessions' results
are then read as UTF-8 JSON and validated against ``schemas/result.schema.json``.
A file that cannot be used (not UTF-8, not JSON, nested too deeply, invalid)
is listed with the reason, never fatal: one bad file must not hide the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_afd.report.scan import OTHER, UNUSABLE, FileFacts, ScanCache, read_json
from pytest_afd.results.documents import ResultValidationError, validate_result
from pytest_afd.results.manifest import stack_digest, with_run
from pytest_afd.results.shared import SESSIONS_DIR_NAME

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


@dataclass(frozen=True)
class EarlierResult:
    """A result file of a session the report does not show: only its path and session."""

    path: Path | None
    session: str | None


@dataclass
class LoadedResults:
    results: list[LoadedResult] = field(default_factory=list)
    # (file, reason) for files that could not be used.
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    # JSON that is not a result (the session summary, manifests): named, not an error.
    ignored: list[Path] = field(default_factory=list)
    # Result files of other sessions, left out by the session filter (never validated).
    earlier: list[EarlierResult] = field(default_factory=list)
    # How many results predate run identities and sessions (read through legacy_view).
    legacy: int = 0


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


def load_results(
    results_dir: Path,
    *,
    exclude: Path | None = None,
    latest_only: bool = False,
    session: str | None = None,
) -> LoadedResults:
    """The valid results under ``results_dir``, except files under ``exclude`` (the report).

    Sessions are chosen before anything is validated (``latest_only``: the
    newest session with a valid result; ``session``: that one); the other
    sessions' files are only scanned and listed in ``earlier``. Facts and
    validation verdicts are cached by file identity (pytest_afd.report.scan).
    The sessions' bookkeeping (``.afd-sessions``: leases and per-session
    summaries) is never read as a result.
    """
    loaded = LoadedResults()
    report_dir = (exclude or results_dir / REPORT_DIR_NAME).resolve()
    cache = ScanCache.open(results_dir)
    scanned: list[tuple[Path, FileFacts]] = []
    sessions_dir = (results_dir / SESSIONS_DIR_NAME).resolve()
    for path in sorted(results_dir.rglob("*.json")):
        parents = path.resolve().parents
        if report_dir in parents or sessions_dir in parents or not path.is_file():
            continue
        facts = cache.facts(path)
        if facts.kind == UNUSABLE:
            loaded.skipped.append((path, facts.reason or "unusable"))
        elif facts.kind == OTHER:
            loaded.ignored.append(path)
        else:
            scanned.append((path, facts))
    if session is not None:
        chosen = [item for item in scanned if item[1].session == session]
        loaded.earlier = [EarlierResult(p, f.session) for p, f in scanned if f.session != session]
        _read_valid(chosen, cache, loaded)
    elif latest_only:
        _read_latest_session(scanned, cache, loaded)
    else:
        _read_valid(scanned, cache, loaded)
    cache.save()
    return loaded


def _read_valid(chosen: Sequence[tuple[Path, FileFacts]], cache: ScanCache,
                loaded: LoadedResults) -> None:
    for path, facts in chosen:
        try:
            doc = read_json(path)
        except ValueError as exc:
            loaded.skipped.append((path, str(exc)))
            continue
        reason, upgraded = facts.reason, None
        if not facts.validated:
            reason, upgraded = _verdict(doc)
            cache.validated(path, reason, legacy=upgraded is not None)
        elif facts.legacy:
            upgraded = legacy_view(doc)
        if reason is not None:
            loaded.skipped.append((path, reason))
            continue
        if upgraded is not None:
            doc = upgraded
            loaded.legacy += 1
        loaded.results.append(LoadedResult(path=path, doc=doc))


def _verdict(doc: Mapping[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """(why the document is unusable or None, its legacy view when it is a legacy result)."""
    reason = _validation_reason(doc)
    if reason is None:
        return None, None
    try:
        upgraded = legacy_view(doc)
    except (TypeError, KeyError, AttributeError, ValueError):
        upgraded = None
    if upgraded is None or _validation_reason(upgraded) is not None:
        return reason, None
    return None, upgraded


def _read_latest_session(scanned: Sequence[tuple[Path, FileFacts]], cache: ScanCache,
                         loaded: LoadedResults) -> None:
    """Newest session first (by its newest created_at); the first with a valid result wins."""
    by_session: dict[str | None, list[tuple[Path, FileFacts]]] = {}
    for item in scanned:
        by_session.setdefault(item[1].session, []).append(item)
    order = sorted(by_session, key=lambda s: max(f.created_at or "" for _, f in by_session[s]),
                   reverse=True)
    chosen: str | None = None
    for candidate in order:
        _read_valid(by_session[candidate], cache, loaded)
        if loaded.results:
            chosen = candidate
            break
    unusable = {path for path, _ in loaded.skipped}
    loaded.earlier = [
        EarlierResult(path, facts.session)
        for candidate in order
        if candidate != chosen
        for path, facts in by_session[candidate]
        if path not in unusable
    ]


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
    earlier = [*loaded.earlier,
               *(EarlierResult(r.path, r.session) for r in loaded.results if r.session != latest)]
    return LoadedResults(kept, loaded.skipped, loaded.ignored, earlier, loaded.legacy)


def session_label(session: str | None) -> str:
    return LEGACY_SESSION_LABEL if session is None else session


def verdict_rank(result: LoadedResult) -> int:
    status = result.status
    return VERDICT_ORDER.index(status) if status in VERDICT_ORDER else 0
