"""Per-rank worker evidence: one JSON line per prefill step, whole lines only, bounded size.

Why a file per rank and not a collective: evidence must never add a
communication to the step, and a rank that dies must not take the other ranks'
lines with it. Every line is one ``os.write`` of a complete, newline-terminated
record on an ``O_APPEND`` descriptor, so a reader sees whole lines plus at
most one incomplete trailing line of a writer that is mid-append or died.

The file is capped at ``max_bytes`` (``AFD_EVIDENCE_MAX_BYTES``, default
``DEFAULT_MAX_FILE_BYTES``). When the next line would not fit, the writer
appends one ``CAP_MARKER_KIND`` line (space for it is reserved, so the file
never exceeds the cap) and stops: a reader can tell "evidence stopped at step
N" from "the run had N steps".

Several processes may share one file (xdist workers, two servers on one
directory): every append holds an exclusive ``flock`` on the file while it
reads the file's size and writes, so the cap holds across writers. The marker
is padded to end past ``max_bytes - MARKER_RESERVE_BYTES``, so any writer
(this one, another, or one opened later) sees a capped file from its size
alone and one marker is written. The file is opened with ``O_NOFOLLOW`` and
must be a regular file: a planted symlink, FIFO or device is refused by name.
Settings are resolved once (``EvidenceSettings.from_env``) at start-up: a bad
directory or cap is an error naming the variable and its value.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVIDENCE_DIR_ENV = "AFD_EVIDENCE_DIR"
"""Directory the Attention ranks append their evidence files to; unset: no evidence."""

MAX_BYTES_ENV = "AFD_EVIDENCE_MAX_BYTES"
"""Override of the per-file cap in bytes."""

DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
"""64 MiB per rank: ~100k step lines of a 32-request batch, but only ~550 steps with
DeepSeek V3.2's per-stage expert-load lines (~120 KB each: 2 stages x 58 MoE layers x
256 experts, benchmarks/expert_load_bench.py); raise ``AFD_EVIDENCE_MAX_BYTES`` for
longer runs (the cap marker says where evidence stopped)."""

RECORD_KIND = "afd_step"
"""``kind`` of a step record line."""

UNRECORDED_KIND = "afd_step_unrecorded"
"""``kind`` of the line an evidence-only hook writes for a step it could not describe
(``reason`` says why): the case's step evidence is then absent, naming it."""

CAP_MARKER_KIND = "afd_evidence_cap_reached"
"""``kind`` of the one line written when the cap stops the writer."""

EVIDENCE_FORMAT = 1
"""Version of the line format; readers reject lines of another version by name."""

FILE_SUFFIX = ".jsonl"

MARKER_RESERVE_BYTES = 512
"""Bytes kept free for the cap marker (its encoded length is checked against this)."""

MIN_MAX_BYTES = 2 * MARKER_RESERVE_BYTES
"""Smallest accepted cap: room for at least one small line and the marker."""

FILE_MODE = 0o644


def evidence_file_name(rank_label: str) -> str:
    """File name of one rank's evidence (``rank_label`` like ``attention-rank3``)."""
    if not rank_label or os.sep in rank_label or rank_label.startswith("."):
        raise ValueError(f"evidence rank label {rank_label!r} must be a plain, non-hidden name")
    return rank_label + FILE_SUFFIX


def max_bytes_from_env(environ: Mapping[str, str]) -> int:
    """The cap from ``AFD_EVIDENCE_MAX_BYTES`` (default when unset); errors name the value.

    Only ASCII digits count: ``int()`` would also take ``1_0_0``, `` 10`` or ``+10``.
    """
    raw = environ.get(MAX_BYTES_ENV)
    if raw is None or raw == "":
        return DEFAULT_MAX_FILE_BYTES
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(f"{MAX_BYTES_ENV}={raw!r} is not an integer byte count "
                         "(decimal digits only)")
    value = int(raw)
    if value < MIN_MAX_BYTES:
        raise ValueError(f"{MAX_BYTES_ENV}={raw!r} is below the minimum {MIN_MAX_BYTES} bytes")
    return value


def encode_line(record: Mapping[str, Any]) -> bytes:
    """One compact JSON line; NaN/inf are refused (they are not JSON)."""
    return (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()


def evidence_directory_from_env(environ: Mapping[str, str]) -> Path | None:
    """``AFD_EVIDENCE_DIR`` created and checked writable; None when unset (evidence off)."""
    raw = environ.get(EVIDENCE_DIR_ENV)
    if not raw:
        return None
    directory = Path(raw)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{EVIDENCE_DIR_ENV}={raw!r} is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"{EVIDENCE_DIR_ENV}={raw!r} cannot be created: "
                         f"{error.strerror or error}") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"{EVIDENCE_DIR_ENV}={raw!r} is not writable")
    return directory


@dataclass(frozen=True)
class EvidenceSettings:
    """Where evidence goes and its per-file cap, resolved once at start-up."""

    directory: Path
    max_bytes: int = DEFAULT_MAX_FILE_BYTES

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> EvidenceSettings | None:
        """Both variables checked now (errors name them); None when evidence is off."""
        max_bytes = max_bytes_from_env(environ)
        directory = evidence_directory_from_env(environ)
        return None if directory is None else cls(directory, max_bytes)

    def writer(self, rank_label: str) -> EvidenceWriter:
        return EvidenceWriter(self.directory, rank_label, max_bytes=self.max_bytes)


def open_regular_for_append(path: Path) -> int:
    """An ``O_APPEND`` descriptor on ``path``, refusing symlinks and non-regular files.

    ``O_NOFOLLOW`` fails on a symlink as the last component; ``O_NONBLOCK`` keeps
    the open of a FIFO from waiting for a reader; the file type is checked on
    the open descriptor (no check-then-open race), then blocking mode is restored.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as error:
        if os.path.islink(path):
            raise OSError(f"{path}: evidence file is a symlink; refusing to write through "
                          "it") from None
        raise OSError(f"{path}: cannot open the evidence file: "
                      f"{error.strerror or error}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(f"{path}: evidence file is not a regular file "
                      f"(mode {stat.filemode(mode)}); refusing to write to it")
    os.set_blocking(fd, True)
    return fd


class EvidenceWriter:
    """Appends whole JSON lines to one rank's file until its cap is reached."""

    def __init__(self, directory: str | os.PathLike[str], rank_label: str, *,
                 max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        if max_bytes < MIN_MAX_BYTES:
            raise ValueError(f"max_bytes={max_bytes} is below the minimum {MIN_MAX_BYTES}")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / evidence_file_name(rank_label)
        self.max_bytes = max_bytes
        self._fd = open_regular_for_append(self.path)
        self.capped = self._is_capped(os.fstat(self._fd).st_size)
        self.lines_written = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str], rank_label: str) -> EvidenceWriter | None:
        """A writer when ``AFD_EVIDENCE_DIR`` is set, else None (evidence off)."""
        settings = EvidenceSettings.from_env(environ)
        return None if settings is None else settings.writer(rank_label)

    def _is_capped(self, size: int) -> bool:
        """Data lines end at or below ``max_bytes - reserve``; only a marker ends past it."""
        return size + MARKER_RESERVE_BYTES > self.max_bytes

    def _write_whole(self, line: bytes) -> None:
        written = os.write(self._fd, line)
        if written != len(line):  # regular files write fully or raise; say so if not
            raise OSError(f"{self.path}: short append ({written} of {len(line)} bytes)")

    def _marker(self, record: Mapping[str, Any], size: int) -> bytes:
        """The cap marker, padded (JSON whitespace) to end past ``max_bytes - reserve``."""
        marker = encode_line({
            "kind": CAP_MARKER_KIND,
            "format": EVIDENCE_FORMAT,
            "max_bytes": self.max_bytes,
            "lines_written": self.lines_written,
            "first_dropped_step": record.get("step"),
        })
        if len(marker) > MARKER_RESERVE_BYTES:
            raise AssertionError(f"cap marker of {len(marker)} bytes exceeds its reserve")
        padding = self.max_bytes - MARKER_RESERVE_BYTES + 1 - size - len(marker)
        return marker[:-1] + b" " * max(padding, 0) + b"\n"

    def append(self, record: Mapping[str, Any]) -> bool:
        """Append ``record`` as one line; False once the cap stopped the writer (any writer)."""
        if self.capped:
            return False
        line = encode_line(record)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # size check and write as one step across writers
        try:
            size = os.fstat(self._fd).st_size
            if self._is_capped(size):
                self.capped = True
                return False
            if size + len(line) + MARKER_RESERVE_BYTES > self.max_bytes:
                self._write_whole(self._marker(record, size))
                self.capped = True
                return False
            self._write_whole(line)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self.lines_written += 1
        return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> EvidenceWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
