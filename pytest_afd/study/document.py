"""The study file: canonical JSON, its digest, schema validation and reading (docs/study.md).

The digest is ``sha256:<hex>`` of the canonical JSON (sorted keys, no spaces,
``ensure_ascii=False``) of the document without its ``digest`` key. A study is
never edited in place: :func:`seal` stamps a new digest on a new document (with
``parent_digest`` naming the one it came from), and :func:`load_study` refuses a
file whose content no longer matches its digest, so a hand edit is caught.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from pytest_afd.results.documents import load_schema

STUDY_KIND = "afd-study"
STUDY_SCHEMA_VERSION = 1
STUDY_SCHEMA_FILE = "study.schema.json"
DIGEST_KEY = "digest"
DIGEST_PREFIX = "sha256:"
FILE_MODE = 0o644


class StudyError(ValueError):
    """A study file cannot be used: unreadable, not schema-valid, or its digest does not match."""


def canonical_study_json(doc: Mapping[str, Any]) -> str:
    """The bytes the digest covers: ``doc`` without ``digest``, sorted, compact, unescaped."""
    body = {key: value for key, value in doc.items() if key != DIGEST_KEY}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def study_digest(doc: Mapping[str, Any]) -> str:
    return DIGEST_PREFIX + hashlib.sha256(canonical_study_json(doc).encode("utf-8")).hexdigest()


def utc_now() -> str:
    """ISO 8601 UTC with a ``Z`` (what ``frozen_at`` holds), to the second."""
    return datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def seal(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``doc`` with its digest (re)computed; raises StudyError if not schema-valid."""
    sealed = {key: value for key, value in doc.items() if key != DIGEST_KEY}
    sealed[DIGEST_KEY] = study_digest(sealed)
    errors = schema_errors(sealed)
    if errors:
        raise StudyError("the study does not match schemas/study.schema.json: " + "; ".join(errors))
    return sealed


def derive(parent: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    """A new study from ``parent`` with ``changes``: new ``frozen_at``, parent_digest, digest."""
    child = {key: value for key, value in parent.items() if key != DIGEST_KEY}
    child.update(changes)
    child.update(descent(parent))
    child["frozen_at"] = utc_now()
    return seal(child)


def descent(parent: Mapping[str, Any]) -> dict[str, Any]:
    """``parent_digest`` and ``lineage`` (root first, parent last) of a study derived from ``parent``.

    Why a lineage: gates and Stage A run under the frozen study, stages B-E under the
    one select-references derived from it; publishing the last one must know that the
    earlier results are the same study's, not another's.
    """
    return {"parent_digest": parent[DIGEST_KEY],
            "lineage": [*parent.get("lineage", []), parent[DIGEST_KEY]]}


def belongs(study: Mapping[str, Any], recorded_digest: str) -> bool:
    """A result recorded under ``recorded_digest`` ran under this study or one of its ancestors."""
    return recorded_digest == study[DIGEST_KEY] or recorded_digest in study.get("lineage", [])


@functools.cache
def _validator() -> Draft202012Validator:
    schema = load_schema(STUDY_SCHEMA_FILE)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def schema_errors(doc: Any) -> list[str]:
    """``at /path: message`` for every schema violation, in path order (empty: valid)."""
    errors = sorted(_validator().iter_errors(doc), key=lambda error: list(map(str, error.path)))
    return [f"at /{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in errors]


def check_study(doc: Any, where: str) -> dict[str, Any]:
    """``doc`` when it is a schema-valid study whose digest matches; else StudyError naming ``where``."""
    errors = schema_errors(doc)
    if errors:
        raise StudyError(f"study {where}: not a valid study (schemas/study.schema.json): "
                         + "; ".join(errors))
    recorded, computed = doc[DIGEST_KEY], study_digest(doc)
    if recorded != computed:
        raise StudyError(
            f"study {where}: field 'digest' is {recorded} but the content hashes to {computed}: "
            "the file was edited after it was frozen. A changed study is a new study: derive it "
            "with 'study freeze --from-study' (new digest, parent_digest set) instead of editing"
        )
    return dict(doc)


def load_study(path: str | Path) -> dict[str, Any]:
    """Read, schema-check and digest-check the study at ``path`` (StudyError names the file)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise StudyError(f"study {path}: cannot be read ({exc.strerror or exc})") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StudyError(f"study {path}: not JSON (line {exc.lineno}, column {exc.colno}: "
                         f"{exc.msg})") from exc
    return check_study(doc, str(path))


def write_study(doc: Mapping[str, Any], path: str | Path) -> Path:
    """Write a sealed study (indent 2, UTF-8); refuses one whose digest does not match."""
    path = Path(path)
    checked = check_study(doc, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(checked, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.chmod(FILE_MODE)
    tmp.replace(path)
    return path
