"""Output directories checked at start-up, and temp files of killed writes removed.

A results directory that cannot be written fails the session before any test
runs its workload (instead of failing every test after it). A write killed
between its temp file and the rename (see :func:`pytest_afd.results.documents.atomic_write_bytes`)
leaves ``.<name>.<random>.tmp`` behind; the next session removes those.
"""

from __future__ import annotations

import errno
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_afd.results.documents import ResultValidationError, read_result

# atomic_write_bytes names its temp files ".<target name>.<random>.tmp".
TEMP_FILE_GLOB = ".*.tmp"
# A temp file younger than this may belong to a write still in flight (another
# session sharing the directory); a killed write's file is older at the next start.
STALE_TEMP_AGE_S = 60.0
PROBE_PREFIX = ".afd-write-probe-"
PROBE_BYTES = 64 * 1024
"""Bytes the start-up probe writes and fsyncs: an empty file needs no data block, so only
a real write sees a full filesystem (a summary and a few results need at least this)."""


class OutputDirError(ValueError):
    """An output directory is unusable; the message names the path and what is wrong."""


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor or ".")


def check_writable_dir(path: Path, source: str) -> None:
    """Raise OutputDirError unless ``path`` is (or can be created as) a writable directory.

    Writes (``PROBE_BYTES``, fsynced) and removes one probe file in the nearest
    existing directory: that is the only check that sees read-only mounts,
    permissions, ownership and a full filesystem alike.
    """
    if path.exists() and not path.is_dir():
        raise OutputDirError(f"{source}={str(path)!r} is a file, not a directory")
    base = _nearest_existing(path)
    if not base.is_dir():
        raise OutputDirError(
            f"{source}={str(path)!r} cannot be created: {str(base)!r} is a file, not a directory"
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=base)
    except OSError as error:
        where = "" if base == path else f" (it would be created in {str(base)!r})"
        raise OutputDirError(
            f"{source}={str(path)!r} is not writable{where}: {error.strerror}"
        ) from None
    try:
        written = os.write(fd, bytes(PROBE_BYTES))
        os.fsync(fd)
        if written != PROBE_BYTES:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as error:
        raise OutputDirError(
            f"{source}={str(path)!r}: cannot write {str(base)!r}: "
            f"{(error.strerror or str(error)).lower()}"
        ) from None
    finally:
        os.close(fd)
        os.unlink(probe)


def remove_stale_temp_files(directory: Path, *, now: float | None = None) -> list[Path]:
    """Delete temp files of killed atomic writes under ``directory``; returns what was removed."""
    if not directory.is_dir():
        return []
    cutoff = (time.time() if now is None else now) - STALE_TEMP_AGE_S
    removed = []
    for candidate in sorted(directory.rglob(TEMP_FILE_GLOB)):
        try:
            if candidate.is_file() and candidate.stat().st_mtime < cutoff:
                candidate.unlink()
                removed.append(candidate)
        except OSError:  # a concurrent session removed it first, or a read-only golden dir
            continue
    return removed


def results_written_since(directory: Path, since: float) -> list[tuple[Path, dict[str, Any]]]:
    """Valid result documents in ``directory`` modified at or after ``since``.

    The controller reads back what a crashed xdist worker wrote (it never sent
    its list); files that are not valid results (the summary, foreign JSON)
    are not results and are left out.
    """
    found = []
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            if path.stat().st_mtime < since:
                continue
            found.append((path, read_result(path)))
        except (OSError, ValueError, RecursionError, ResultValidationError):
            continue
    return found
