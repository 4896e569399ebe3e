"""Golden outputs on disk (the ``golden`` fixture): recorded once, checked by later runs.

A golden is ``<dir>/<name>.npz`` (array under key ``value``; or
``<name>.safetensors`` with ``file_format="safetensors"``) plus
``<dir>/<name>.json``, a sidecar recording the profile, dtype, shape, the
SHA-256 of the data bytes, the manifest digest of the run that produced it and
(when the store knows it) that manifest itself. A missing golden, a
missing/corrupt sidecar or a checksum mismatch is an error, never a pass.
``update=True`` (``--afd-update-golden``) rewrites both files atomically.

Concurrent recorders and checkers of one directory (two sessions, xdist
workers) agree through one ``flock`` on ``<dir>/.afd-golden.lock``: a save
holds it exclusively across both renames, a load holds it shared across both
reads, so a check never sees data from one writer with the sidecar of another.

A golden is checked under the profile it was recorded with (a caller asking
for another profile is refused by name), and a golden recorded under another
manifest is compared with a :class:`GoldenManifestWarning` naming the fields
that differ (``strict_manifest=True`` refuses instead). Tolerance profiles and
the comparisons live in :mod:`pytest_afd.golden.compare`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pytest_afd.golden.compare import (
    BFLOAT16_ATOL,
    BFLOAT16_RTOL,
    FLOAT32_ATOL,
    FLOAT32_RTOL,
    PROFILES,
    REPORT_EXAMPLES,
    TOPK_LOGPROB_K,
    W8A8_ATOL,
    W8A8_RTOL,
    Comparison,
    GoldenMismatchError,
    ToleranceProfile,
    assert_matches,
    compare,
    get_profile,
    to_numpy,
)
from pytest_afd.golden.files import (
    GOLDEN_FORMATS,
    GoldenCorruptError,
    GoldenError,
    GoldenManifestError,
    GoldenManifestWarning,
    GoldenMissingError,
    GoldenProfileError,
    check_sidecar_describes,
    deserialize,
    directory_lock,
    manifest_body,
    named_differences,
    serialize,
)
from pytest_afd.results.documents import atomic_write_bytes, atomic_write_json

GOLDEN_FORMAT_VERSION = 1
# What fixes a missing or corrupt golden: rerun with --afd-update-golden, or, for the
# references a check phase reads, the record phase (docs/gates.md).
UPDATE_GOLDEN_COMMAND = "--afd-update-golden"
RECORD_PHASE_COMMAND = ("the record phase (--afd-reference-phase record, against the reference "
                        "deployment, into the same --afd-golden-dir)")
DEFAULT_PROFILE = "float32"
"""Profile of a save, or of a live-reference check, that names none."""
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")

__all__ = [
    "BFLOAT16_ATOL", "BFLOAT16_RTOL", "FLOAT32_ATOL", "FLOAT32_RTOL", "PROFILES",
    "REPORT_EXAMPLES", "TOPK_LOGPROB_K", "W8A8_ATOL", "W8A8_RTOL", "Comparison",
    "GoldenCorruptError", "GoldenError", "GoldenManifestError", "GoldenManifestWarning",
    "GoldenMismatchError", "GoldenMissingError", "GoldenProfileError", "GoldenStore",
    "ToleranceProfile", "assert_matches", "check_metadata", "compare", "get_profile", "to_numpy",
]  # fmt: skip


@dataclass
class GoldenStore:
    """Goldens under ``directory``.

    ``manifest`` (a mapping or a callable giving one) is recorded in each
    sidecar and compared on each check; ``manifest_digest`` (string or callable)
    alone records only the digest. ``file_format`` (``"npz"`` or
    ``"safetensors"``) applies to goldens written by this store; reading
    follows the format the sidecar records.
    """

    directory: Path
    update: bool = False
    manifest_digest: str | Callable[[], str] | None = None
    file_format: str = "npz"
    updated: list[str] = field(default_factory=list)
    # The command that (re)records a golden, named by every missing/corrupt error:
    # --afd-update-golden, or the record phase when a check phase reads references.
    record_with: str = UPDATE_GOLDEN_COMMAND
    manifest: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None
    strict_manifest: bool = False

    def __post_init__(self) -> None:
        if self.file_format not in GOLDEN_FORMATS:
            raise ValueError(f"file_format={self.file_format!r}; expected one of {GOLDEN_FORMATS}")

    def _base(self, name: str) -> Path:
        if not _NAME_PATTERN.match(name) or ".." in name.split("/"):
            raise ValueError(
                f"golden name {name!r} must be path segments of letters, digits, '_', '.', '-'"
            )
        return Path(self.directory) / name

    def paths(self, name: str, file_format: str | None = None) -> tuple[Path, Path]:
        """(data file, JSON sidecar) of golden ``name``."""
        base = self._base(name)
        suffix = file_format or self.file_format
        return base.with_name(f"{base.name}.{suffix}"), base.with_name(base.name + ".json")

    def _manifest(self) -> Mapping[str, Any] | None:
        manifest = self.manifest
        return manifest() if callable(manifest) else manifest

    def _digest(self) -> str | None:
        digest = self.manifest_digest
        if digest is None:
            manifest = self._manifest()
            return None if manifest is None else manifest.get("digest")
        return digest() if callable(digest) else digest

    def save(self, name: str, value: Any, profile: str | ToleranceProfile = DEFAULT_PROFILE,
             *, metadata: Mapping[str, Any] | None = None) -> Path:
        """Write the data file and its sidecar atomically, as one unit under the store's lock.

        ``metadata`` (JSON) lands in the sidecar under ``"metadata"``: what a
        later phase must match before it may compare with this golden (see
        :func:`check_metadata`).
        """
        prof = get_profile(profile)
        array = to_numpy(value)
        payload = serialize(array, self.file_format)
        data_path, json_path = self.paths(name)
        manifest = self._manifest()
        sidecar = {
            "format_version": GOLDEN_FORMAT_VERSION,
            "format": self.file_format,
            "name": name,
            "profile": prof.name,
            "dtype": str(array.dtype),
            "shape": list(array.shape),
            "sha256": hashlib.sha256(payload).hexdigest(),
            "manifest_digest": self._digest(),
            "created_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        }
        if manifest is not None:
            sidecar["manifest"] = manifest_body(manifest)
        if metadata is not None:
            sidecar["metadata"] = dict(metadata)
        with directory_lock(Path(self.directory), exclusive=True):
            atomic_write_bytes(data_path, payload)
            atomic_write_json(json_path, sidecar)
        self.updated.append(name)
        return data_path

    def _sidecar(self, name: str) -> dict[str, Any]:
        data_path, json_path = self.paths(name)
        if not json_path.exists():
            present = [p for f in GOLDEN_FORMATS if (p := self.paths(name, f)[0]).exists()]
            if present:
                raise GoldenCorruptError(
                    f"golden {name!r} is incomplete: {json_path} is missing next to {present[0]}"
                )
            raise GoldenMissingError(
                f"golden {name!r} not found at {data_path}; record it with {self.record_with}"
            )
        try:
            sidecar = json.loads(json_path.read_text())
        except (OSError, ValueError) as exc:
            raise GoldenCorruptError(
                f"golden {name!r}: sidecar {json_path} is not valid JSON: {exc}"
            ) from exc
        if not isinstance(sidecar, dict) or "sha256" not in sidecar:
            raise GoldenCorruptError(
                f"golden {name!r}: sidecar {json_path} lacks the 'sha256' field"
            )
        if sidecar.get("format", "npz") not in GOLDEN_FORMATS:
            raise GoldenCorruptError(
                f"golden {name!r}: sidecar format {sidecar.get('format')!r} is not one of {GOLDEN_FORMATS}"
            )
        return sidecar

    def load(self, name: str) -> tuple[np.ndarray, dict[str, Any]]:
        """The stored array and its sidecar, read as one pair under the store's shared lock;
        raises a :class:`GoldenError` when it cannot be trusted."""
        with directory_lock(Path(self.directory), exclusive=False):
            sidecar = self._sidecar(name)
            file_format = sidecar.get("format", "npz")
            data_path, _ = self.paths(name, file_format)
            if not data_path.exists():
                raise GoldenCorruptError(f"golden {name!r} is incomplete: {data_path} is missing")
            data = data_path.read_bytes()
        actual_sha = hashlib.sha256(data).hexdigest()
        if actual_sha != sidecar["sha256"]:
            raise GoldenCorruptError(
                f"golden {name!r}: {data_path} sha256 {actual_sha[:12]}… does not match the sidecar's "
                f"{str(sidecar['sha256'])[:12]}… (edited or torn write); re-record with {self.record_with}"
            )
        try:
            array = deserialize(data, file_format)
        except Exception as exc:  # any reader failure means the file cannot be trusted
            raise GoldenCorruptError(f"golden {name!r}: cannot read {data_path}: {exc}") from exc
        check_sidecar_describes(name, sidecar, array, data_path, self.record_with)
        return array, sidecar

    def _recorded_profile(self, name: str, sidecar: Mapping[str, Any],
                          asked: str | ToleranceProfile | None) -> ToleranceProfile:
        """The profile the golden was recorded with; a check asking for another is refused."""
        recorded = sidecar.get("profile")
        if recorded not in PROFILES:
            raise GoldenCorruptError(f"golden {name!r}: sidecar profile {recorded!r} is not one "
                                     f"of {tuple(PROFILES)}")
        if asked is not None and get_profile(asked).name != recorded:
            raise GoldenProfileError(
                f"golden {name!r} was recorded with profile {recorded!r} but is checked with "
                f"{get_profile(asked).name!r}; check it with profile={recorded!r} or re-record "
                "it with --afd-update-golden")
        return PROFILES[recorded]

    def _manifest_note(self, name: str, sidecar: Mapping[str, Any]) -> str:
        """'' when recorded under this run's manifest; else the differing fields (warned, or
        refused under ``strict_manifest``)."""
        recorded_digest, current_digest = sidecar.get("manifest_digest"), self._digest()
        if not recorded_digest or not current_digest or recorded_digest == current_digest:
            return ""
        note = (f"golden {name!r} was recorded under another manifest: "
                + named_differences(sidecar.get("manifest"), self._manifest(),
                                     recorded_digest, current_digest))
        if self.strict_manifest:
            raise GoldenManifestError(note + "; re-record it with --afd-update-golden")
        warnings.warn(GoldenManifestWarning(note), stacklevel=3)
        return note

    def check(
        self,
        name: str,
        value: Any,
        *,
        profile: str | ToleranceProfile | None = None,
        reference: Any = None,
    ) -> Comparison:
        """Compare ``value`` to the stored golden ``name`` (or to a live ``reference``).

        A stored golden is compared under the profile it was recorded with
        (``profile``, when given, must be that one). Under ``update`` the golden
        is (re)written from ``value`` instead. A mismatch raises
        :class:`GoldenMismatchError` whose message is the report.
        """
        if reference is not None:
            return assert_matches(value, reference, profile or DEFAULT_PROFILE)
        if self.update:
            prof = get_profile(profile or DEFAULT_PROFILE)
            self.save(name, value, prof)
            return Comparison(True, prof.name, f"golden {name!r} updated")
        expected, sidecar = self.load(name)
        prof = self._recorded_profile(name, sidecar, profile)
        note = self._manifest_note(name, sidecar)
        result = compare(value, expected, prof)
        if note:
            result.details["manifest_mismatch"] = note
        if not result.ok:
            raise GoldenMismatchError(f"golden {name!r}: {result.report}"
                                      + (f" ({note})" if note else ""))
        return result


def check_metadata(name: str, sidecar: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """A golden recorded in another run is usable only for the same inputs: name every difference.

    Two-phase gate references (docs/gates.md) are recorded from one deployment
    and checked against a later one; comparing against a reference of other
    prompts or settings would be a meaningless pass or fail.
    """
    recorded = sidecar.get("metadata")
    if not isinstance(recorded, Mapping):
        raise GoldenCorruptError(f"golden {name!r} has no metadata: it was not recorded as a "
                                 f"gate reference (record it with {RECORD_PHASE_COMMAND})")
    differences = {key: (recorded.get(key), value) for key, value in expected.items()
                   if recorded.get(key) != value}
    if differences:
        raise GoldenMismatchError(
            f"golden {name!r} was recorded for other inputs (field: (recorded, this run)) "
            f"{differences}; re-record it with {RECORD_PHASE_COMMAND}"
        )
