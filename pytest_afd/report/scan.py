"""Scanning result files cheaply: kind, session and creation time, cached by file identity.

A report of the latest session must not validate (or even fully parse) a
nightly history of thousands of files. Each file is scanned once: its bytes
are searched for the top-level ``"kind": "afd-result"``, ``"session_id"`` and
``"created_at"`` (the writer's key-sorted, indented JSON has each exactly
once); a file where that is ambiguous is parsed instead. The facts, and later
the validation verdict, are kept in ``RESULTS_DIR/.afd-report-cache`` keyed
by (path, size, mtime_ns, inode) and the schemas' digest, so an unchanged
file is never scanned or validated twice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pytest_afd.results.documents import (
    MANIFEST_SCHEMA_FILE,
    RESULT_SCHEMA_FILE,
    atomic_write_json,
    schemas_dir,
)

CACHE_FILE_NAME = ".afd-report-cache"  # not *.json: never read as a result
CACHE_VERSION = 1
RESULT_KIND = "afd-result"
RESULT, OTHER, UNUSABLE = "result", "other", "unusable"
KIND_MARK = re.compile(rb'"kind"\s*:\s*"afd-result"')
SESSION_MARK = re.compile(rb'"session_id"\s*:\s*"((?:[^"\\]|\\.)*)"')
CREATED_MARK = re.compile(rb'"created_at"\s*:\s*"((?:[^"\\]|\\.)*)"')
KEY_MARKS = (b'"kind"', b'"session_id"', b'"created_at"')


@dataclass(frozen=True)
class FileFacts:
    """What the report needs to know of a file before deciding to read it."""

    identity: tuple[int, int, int]  # size, mtime_ns, inode
    kind: str  # RESULT, OTHER or UNUSABLE
    session: str | None = None
    created_at: str | None = None
    # UNUSABLE: why; RESULT: the validation verdict once validated (None = valid).
    reason: str | None = None
    validated: bool = False
    legacy: bool = False


def read_json(path: Path) -> Any:
    """The parsed file; ValueError with a one-line reason when it is not usable JSON."""
    try:
        return parse_json(path.read_bytes())
    except OSError as exc:
        raise ValueError(f"unreadable: {exc.strerror or exc}") from None


def parse_json(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"unreadable JSON: {exc}") from None
    except RecursionError:
        raise ValueError("unreadable JSON: nested too deeply to parse") from None


def identity(path: Path) -> tuple[int, int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns, stat.st_ino


def _string(match: re.Match[bytes]) -> str:
    return json.loads(b'"' + match.group(1) + b'"')


def scan_bytes(data: bytes, file_identity: tuple[int, int, int]) -> FileFacts:
    """Facts from the bytes when each key occurs once; otherwise from the parsed document."""
    if all(data.count(mark) == 1 for mark in KEY_MARKS):
        kind, session, created = (
            KIND_MARK.search(data), SESSION_MARK.search(data), CREATED_MARK.search(data)
        )  # fmt: skip
        if kind and session and created:
            return FileFacts(file_identity, RESULT, _string(session), _string(created))
    try:
        doc = parse_json(data)
    except ValueError as exc:
        return FileFacts(file_identity, UNUSABLE, reason=str(exc))
    if not isinstance(doc, dict) or doc.get("kind") != RESULT_KIND:
        return FileFacts(file_identity, OTHER)
    session, created = doc.get("session_id"), doc.get("created_at")
    return FileFacts(
        file_identity,
        RESULT,
        session if isinstance(session, str) else None,
        created if isinstance(created, str) else None,
    )


@functools.cache
def schemas_digest() -> str:
    digest = hashlib.sha256()
    for name in (RESULT_SCHEMA_FILE, MANIFEST_SCHEMA_FILE):
        digest.update((schemas_dir() / name).read_bytes())
    return digest.hexdigest()


class ScanCache:
    """Per-directory facts by file identity; unwritable directories just go uncached."""

    def __init__(self, path: Path, entries: dict[str, FileFacts]) -> None:
        self.path = path
        self.entries = entries
        self.changed = False
        self.seen: set[str] = set()

    @classmethod
    def open(cls, results_dir: Path) -> ScanCache:
        path = results_dir / CACHE_FILE_NAME
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls(path, {})
        if not isinstance(doc, Mapping) or doc.get("version") != CACHE_VERSION or doc.get(
            "schemas"
        ) != schemas_digest():
            return cls(path, {})
        try:
            entries = {
                name: FileFacts(**{**entry, "identity": tuple(entry["identity"])})
                for name, entry in doc["files"].items()
            }
        except (TypeError, KeyError):
            return cls(path, {})
        return cls(path, entries)

    def facts(self, path: Path) -> FileFacts:
        """The cached facts when the file is unchanged, else a fresh scan."""
        key = str(path)
        self.seen.add(key)
        try:
            current = identity(path)
        except OSError as exc:
            return FileFacts((0, 0, 0), UNUSABLE, reason=f"unreadable: {exc.strerror or exc}")
        cached = self.entries.get(key)
        if cached is not None and cached.identity == current:
            return cached
        try:
            data = path.read_bytes()
        except OSError as exc:
            return FileFacts(current, UNUSABLE, reason=f"unreadable: {exc.strerror or exc}")
        facts = scan_bytes(data, current)
        self.entries[key] = facts
        self.changed = True
        return facts

    def validated(self, path: Path, reason: str | None, *, legacy: bool) -> None:
        key = str(path)
        if key in self.entries:
            self.entries[key] = replace(
                self.entries[key], validated=True, reason=reason, legacy=legacy
            )
            self.changed = True

    def save(self) -> None:
        """Write the entries of the files seen this time (gone files drop out)."""
        if not self.changed and self.seen == set(self.entries):
            return
        doc = {
            "version": CACHE_VERSION,
            "schemas": schemas_digest(),
            "files": {name: asdict(self.entries[name]) for name in sorted(self.seen)
                      if name in self.entries},
        }
        try:
            atomic_write_json(self.path, doc)
        except OSError:
            return  # a read-only results directory: report without a cache
        self.changed = False

