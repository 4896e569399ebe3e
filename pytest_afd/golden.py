"""Golden-output tolerance comparisons (the ``golden`` fixture).

A golden is ``<dir>/<name>.npz`` (array under key ``value``; or
``<name>.safetensors`` with ``file_format="safetensors"``) plus
``<dir>/<name>.json``, a sidecar recording the profile, dtype, shape, the
SHA-256 of the ``.npz`` bytes and the manifest digest of the run that produced
it. A missing golden, a missing/corrupt sidecar or a checksum mismatch is an
error, never a pass. ``update=True`` (``--afd-update-golden``) rewrites both
files atomically.

Profiles:

* ``exact`` — token ids: bitwise equality.
* ``float32`` / ``bfloat16`` — ``torch.testing.assert_close`` default
  tolerances for that dtype: ``|a - e| <= atol + rtol * |e|``.
* ``w8a8`` — the quantized model's documented tolerance (:data:`W8A8_ATOL`,
  :data:`W8A8_RTOL`, see ``docs/tolerance.md``).
* ``topk_logprob`` — logits/logprobs ``[..., vocab]``: per row, when the argmax
  tokens differ each side's token must be in the other's top-k (as vLLM's
  ``check_logprobs_close``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from pytest_afd.results import atomic_write_bytes, atomic_write_json

GOLDEN_FORMAT_VERSION = 1
NPZ_KEY = "value"
# torch.testing.assert_close defaults (torch/testing/_comparison.py).
FLOAT32_RTOL = 1.3e-6
FLOAT32_ATOL = 1e-5
BFLOAT16_RTOL = 1.6e-2
BFLOAT16_ATOL = 1e-5
# W8A8 tolerance on last-token logits, measured (docs/tolerance.md; owned by the
# CPU-backend engineer): the CPU W8A8 emulation is bitwise batch-invariant
# (split / chunked / prefix-cached runs equal the unsplit run in 144 of 144
# measured cases), so W8A8-vs-W8A8 comparisons get the float32 allowance and no
# more. W8A8 vs float32 differs by up to 5.6 in logits: never a gate criterion.
W8A8_ATOL = FLOAT32_ATOL
W8A8_RTOL = FLOAT32_RTOL
# k of the top-k cross-containment check (vLLM's check_logprobs_close uses the
# number of logprobs requested; 5 is its common test setting).
TOPK_LOGPROB_K = 5
# How many offending rows/elements a mismatch report lists.
REPORT_EXAMPLES = 5
# What fixes a missing or corrupt golden: rerun with --afd-update-golden, or, for the
# references a check phase reads, the record phase (docs/gates.md).
UPDATE_GOLDEN_COMMAND = "--afd-update-golden"
RECORD_PHASE_COMMAND = ("the record phase (--afd-reference-phase record, against the reference "
                        "deployment, into the same --afd-golden-dir)")
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$")


class GoldenError(Exception):
    """Base of golden-store errors that are never a pass."""


class GoldenMissingError(GoldenError):
    """No golden stored under that name (record it with ``--afd-update-golden``)."""


class GoldenCorruptError(GoldenError):
    """The stored golden cannot be trusted (unreadable, checksum or sidecar mismatch)."""


class GoldenMismatchError(AssertionError):
    """Value and golden differ beyond the profile's tolerance; the message is the report."""


@dataclass(frozen=True)
class ToleranceProfile:
    name: str
    kind: str  # "exact", "close" or "topk"
    atol: float = 0.0
    rtol: float = 0.0
    topk: int = 0

    def describe(self) -> str:
        if self.kind == "close":
            return f"{self.name} (atol={self.atol:g}, rtol={self.rtol:g})"
        if self.kind == "topk":
            return f"{self.name} (k={self.topk})"
        return self.name


PROFILES: Mapping[str, ToleranceProfile] = MappingProxyType(
    {
        "exact": ToleranceProfile("exact", "exact"),
        "float32": ToleranceProfile("float32", "close", FLOAT32_ATOL, FLOAT32_RTOL),
        "bfloat16": ToleranceProfile("bfloat16", "close", BFLOAT16_ATOL, BFLOAT16_RTOL),
        "w8a8": ToleranceProfile("w8a8", "close", W8A8_ATOL, W8A8_RTOL),
        "topk_logprob": ToleranceProfile("topk_logprob", "topk", topk=TOPK_LOGPROB_K),
    }
)


def get_profile(profile: str | ToleranceProfile) -> ToleranceProfile:
    if isinstance(profile, ToleranceProfile):
        return profile
    if profile not in PROFILES:
        raise ValueError(
            f"unknown tolerance profile {profile!r}; expected one of {tuple(PROFILES)}"
        )
    return PROFILES[profile]


def to_numpy(value: Any) -> np.ndarray:
    """numpy view of arrays, torch tensors (bfloat16 widened to float32) and lists."""
    if isinstance(value, np.ndarray):
        return value
    module = type(value).__module__
    if module.startswith("torch"):
        tensor = value.detach().cpu()
        if (
            not tensor.dtype.is_floating_point
            or tensor.dtype.itemsize >= np.dtype(np.float32).itemsize
        ):
            return tensor.numpy()
        return tensor.float().numpy()
    return np.asarray(value)


@dataclass
class Comparison:
    """Outcome of one comparison; ``report`` explains a failure."""

    ok: bool
    profile: str
    report: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    num_mismatched: int = 0
    num_total: int = 0
    details: dict[str, Any] = field(default_factory=dict)


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def _compare_exact(
    actual: np.ndarray, expected: np.ndarray, profile: ToleranceProfile
) -> Comparison:
    bad = actual != expected
    count = int(bad.sum())
    if count == 0:
        return Comparison(True, profile.name, num_total=actual.size)
    flat = np.flatnonzero(bad)
    examples = ", ".join(
        f"{_index(i, actual.shape)}: {actual.flat[i].item()!r} != {expected.flat[i].item()!r}"
        for i in flat[:REPORT_EXAMPLES]
    )
    report = f"{count} of {actual.size} elements differ (exact); first at {examples}"
    return Comparison(False, profile.name, report, num_mismatched=count, num_total=actual.size)


def _compare_close(
    actual: np.ndarray, expected: np.ndarray, profile: ToleranceProfile
) -> Comparison:
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    abs_err = np.abs(a - e)
    nan_mismatch = np.isnan(a) | np.isnan(e)
    abs_err = np.where(nan_mismatch, np.inf, abs_err)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_err = np.where(e != 0, abs_err / np.abs(e), np.where(abs_err == 0, 0.0, np.inf))
    rel_err = np.where(nan_mismatch, np.inf, rel_err)
    # NaN never matches (torch.testing's equal_nan=False default).
    exceed = nan_mismatch | (abs_err > profile.atol + profile.rtol * np.abs(e))
    count = int(exceed.sum())
    max_abs = float(abs_err.max()) if abs_err.size else 0.0
    max_rel = float(rel_err.max()) if rel_err.size else 0.0
    if count == 0:
        return Comparison(True, profile.name, "", max_abs, max_rel, 0, actual.size)
    where_abs = _index(int(abs_err.argmax()), actual.shape)
    where_rel = _index(int(rel_err.argmax()), actual.shape)
    first = np.flatnonzero(exceed)[:REPORT_EXAMPLES]
    examples = ", ".join(
        f"{_index(i, actual.shape)}: {a.flat[i]:.6g} vs {e.flat[i]:.6g}" for i in first
    )
    report = (
        f"{count} of {actual.size} elements exceed {profile.describe()}; "
        f"max abs error {max_abs:.6g} at {where_abs}, max rel error {max_rel:.6g} at {where_rel}; "
        f"first: {examples}"
    )
    return Comparison(False, profile.name, report, max_abs, max_rel, count, actual.size)


def _compare_topk(
    actual: np.ndarray, expected: np.ndarray, profile: ToleranceProfile
) -> Comparison:
    if actual.ndim == 0:
        raise ValueError("topk_logprob compares [..., vocab] logits or logprobs, got a scalar")
    vocab = actual.shape[-1]
    k = min(profile.topk, vocab)
    a_rows = actual.reshape(-1, vocab).astype(np.float64)
    e_rows = expected.reshape(-1, vocab).astype(np.float64)
    a_top = np.argsort(-a_rows, axis=1, kind="stable")[:, :k]
    e_top = np.argsort(-e_rows, axis=1, kind="stable")[:, :k]
    failures = []
    for row in range(a_rows.shape[0]):
        a_tok, e_tok = int(a_top[row, 0]), int(e_top[row, 0])
        if a_tok != e_tok and (a_tok not in e_top[row] or e_tok not in a_top[row]):
            failures.append(f"row {row}: token {a_tok} vs golden {e_tok}")
    if not failures:
        return Comparison(True, profile.name, num_total=a_rows.shape[0])
    report = (
        f"{len(failures)} of {a_rows.shape[0]} rows fail {profile.describe()} "
        f"(argmax tokens not in each other's top-{k}): {'; '.join(failures[:REPORT_EXAMPLES])}"
    )
    return Comparison(
        False, profile.name, report, num_mismatched=len(failures), num_total=a_rows.shape[0]
    )


_COMPARATORS: Mapping[str, Callable[[np.ndarray, np.ndarray, ToleranceProfile], Comparison]] = (
    MappingProxyType({"exact": _compare_exact, "close": _compare_close, "topk": _compare_topk})
)


def compare(actual: Any, expected: Any, profile: str | ToleranceProfile = "float32") -> Comparison:
    """Compare ``actual`` with ``expected`` under ``profile`` (never raises on a mismatch)."""
    prof = get_profile(profile)
    a, e = to_numpy(actual), to_numpy(expected)
    if a.shape != e.shape:
        return Comparison(
            False, prof.name, f"shape {a.shape} != expected shape {e.shape}", num_total=a.size
        )
    return _COMPARATORS[prof.kind](a, e, prof)


def assert_matches(
    actual: Any, expected: Any, profile: str | ToleranceProfile = "float32"
) -> Comparison:
    """:func:`compare` that raises :class:`GoldenMismatchError` with the report."""
    result = compare(actual, expected, profile)
    if not result.ok:
        raise GoldenMismatchError(result.report)
    return result


GOLDEN_FORMATS = ("npz", "safetensors")


def _serialize(array: np.ndarray, file_format: str) -> bytes:
    if file_format == "safetensors":
        from safetensors.numpy import save  # optional dependency, imported on use

        return save({NPZ_KEY: np.ascontiguousarray(array)})
    buffer = io.BytesIO()
    np.savez(buffer, **{NPZ_KEY: array})
    return buffer.getvalue()


def _deserialize(data: bytes, file_format: str) -> np.ndarray:
    if file_format == "safetensors":
        from safetensors.numpy import load

        return load(data)[NPZ_KEY]
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return archive[NPZ_KEY]


def _check_sidecar_describes(
    name: str, sidecar: dict[str, Any], array: np.ndarray, data_path: Path, record_with: str
) -> None:
    """The sidecar's dtype and shape must be the stored array's: a checksum alone cannot
    tell a golden re-recorded from another tensor under a stale sidecar."""
    recorded = {"dtype": sidecar.get("dtype"), "shape": sidecar.get("shape")}
    stored = {"dtype": str(array.dtype), "shape": list(array.shape)}
    for key, value in recorded.items():
        if value != stored[key]:
            raise GoldenCorruptError(
                f"golden {name!r}: sidecar {key} {value!r} does not match {data_path}'s "
                f"{stored[key]!r}; re-record with {record_with}"
            )


@dataclass
class GoldenStore:
    """Goldens under ``directory``; ``manifest_digest`` may be a string or a callable giving one.

    ``file_format`` (``"npz"`` or ``"safetensors"``) applies to goldens written
    by this store; reading follows the format the sidecar records.
    """

    directory: Path
    update: bool = False
    manifest_digest: str | Callable[[], str] | None = None
    file_format: str = "npz"
    updated: list[str] = field(default_factory=list)
    # The command that (re)records a golden, named by every missing/corrupt error:
    # --afd-update-golden, or the record phase when a check phase reads references.
    record_with: str = UPDATE_GOLDEN_COMMAND

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

    def _digest(self) -> str | None:
        digest = self.manifest_digest
        return digest() if callable(digest) else digest

    def save(self, name: str, value: Any, profile: str | ToleranceProfile = "float32",
             *, metadata: Mapping[str, Any] | None = None) -> Path:
        """Write the data file and its sidecar atomically (temp file, fsync, rename).

        ``metadata`` (JSON) lands in the sidecar under ``"metadata"``: what a
        later phase must match before it may compare with this golden (see
        :func:`check_metadata`).
        """
        prof = get_profile(profile)
        array = to_numpy(value)
        payload = _serialize(array, self.file_format)
        data_path, json_path = self.paths(name)
        atomic_write_bytes(data_path, payload)
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
        if metadata is not None:
            sidecar["metadata"] = dict(metadata)
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
        """The stored array and its sidecar; raises a :class:`GoldenError` when it cannot be trusted."""
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
            array = _deserialize(data, file_format)
        except Exception as exc:  # any reader failure means the file cannot be trusted
            raise GoldenCorruptError(f"golden {name!r}: cannot read {data_path}: {exc}") from exc
        _check_sidecar_describes(name, sidecar, array, data_path, self.record_with)
        return array, sidecar

    def check(
        self,
        name: str,
        value: Any,
        *,
        profile: str | ToleranceProfile = "float32",
        reference: Any = None,
    ) -> Comparison:
        """Compare ``value`` to the stored golden ``name`` (or to a live ``reference``).

        Under ``update`` the golden is (re)written from ``value`` instead. A
        mismatch raises :class:`GoldenMismatchError` whose message is the report.
        """
        if reference is not None:
            return assert_matches(value, reference, profile)
        if self.update:
            self.save(name, value, profile)
            return Comparison(True, get_profile(profile).name, f"golden {name!r} updated")
        expected, sidecar = self.load(name)
        result = compare(value, expected, profile)
        if not result.ok:
            produced_by = sidecar.get("manifest_digest")
            current = self._digest()
            note = (
                f" (golden recorded under manifest {produced_by}, this run is {current})"
                if produced_by and current and produced_by != current
                else ""
            )
            raise GoldenMismatchError(f"golden {name!r}: {result.report}{note}")
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
