"""How a golden sits on disk: its file formats, the store's lock, the errors that are never a pass.

The store itself (names, sidecars, save, load, check) is :class:`pytest_afd.golden.store.GoldenStore`,
which re-exports the errors.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pytest_afd.results.manifest import manifest_differences

NPZ_KEY = "value"
LOCK_FILE_NAME = ".afd-golden.lock"
LOCK_FILE_MODE = 0o644
MANIFEST_DIFFERENCES_SHOWN = 8
"""How many differing manifest fields a message lists (the count is always given)."""


class GoldenError(Exception):
    """Base of golden-store errors that are never a pass."""


class GoldenMissingError(GoldenError):
    """No golden stored under that name (record it with ``--afd-update-golden``)."""


class GoldenCorruptError(GoldenError):
    """The stored golden cannot be trusted (unreadable, checksum or sidecar mismatch)."""


class GoldenProfileError(GoldenError):
    """The check asked for another profile than the golden was recorded with."""


class GoldenManifestError(GoldenError):
    """``strict_manifest``: the golden was recorded under another manifest (fields named)."""


class GoldenManifestWarning(UserWarning):
    """The golden was recorded under another manifest; the message names the differing fields."""


@contextlib.contextmanager
def directory_lock(directory: Path, *, exclusive: bool) -> Iterator[None]:
    """``flock`` on the store's lock file: exclusive for a save, shared for a load.

    A reader that can neither open nor create the lock file (a read-only
    checkout of recorded goldens) reads unlocked: nobody can write there either.
    """
    path = Path(directory) / LOCK_FILE_NAME
    if exclusive:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, LOCK_FILE_MODE)
    except OSError:
        if exclusive:
            raise
        fd = -1
    try:
        if fd >= 0:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        if fd >= 0:
            os.close(fd)  # closing releases the lock


def manifest_body(manifest: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in manifest.items() if key != "digest"}


def named_differences(recorded: Mapping[str, Any] | None, current: Mapping[str, Any] | None,
                       recorded_digest: str, current_digest: str) -> str:
    """``"N fields differ: /a/b (recorded x, this run y), ..."``, or the two digests when
    either side's manifest is not stored (goldens recorded before manifests were kept)."""
    if not isinstance(recorded, Mapping) or current is None:
        return (f"manifest {recorded_digest} (its fields were not recorded) vs this run's "
                f"{current_digest}")
    differences = manifest_differences(manifest_body(recorded), manifest_body(current))
    shown = ", ".join(f"{path} (recorded {old!r}, this run {new!r})"
                      for path, old, new in differences[:MANIFEST_DIFFERENCES_SHOWN])
    more = len(differences) - MANIFEST_DIFFERENCES_SHOWN
    return (f"{len(differences)} manifest field(s) differ: {shown}"
            + (f", and {more} more" if more > 0 else ""))


GOLDEN_FORMATS = ("npz", "safetensors")


def serialize(array: np.ndarray, file_format: str) -> bytes:
    if file_format == "safetensors":
        from safetensors.numpy import save  # optional dependency, imported on use

        return save({NPZ_KEY: np.ascontiguousarray(array)})
    buffer = io.BytesIO()
    np.savez(buffer, **{NPZ_KEY: array})
    return buffer.getvalue()


def deserialize(data: bytes, file_format: str) -> np.ndarray:
    if file_format == "safetensors":
        from safetensors.numpy import load

        return load(data)[NPZ_KEY]
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return archive[NPZ_KEY]


def check_sidecar_describes(
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
