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
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
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
    """The cap from ``AFD_EVIDENCE_MAX_BYTES`` (default when unset); errors name the value."""
    raw = environ.get(MAX_BYTES_ENV)
    if raw is None or raw == "":
        return DEFAULT_MAX_FILE_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_BYTES_ENV}={raw!r} is not an integer byte count") from None
    if value < MIN_MAX_BYTES:
        raise ValueError(f"{MAX_BYTES_ENV}={raw!r} is below the minimum {MIN_MAX_BYTES} bytes")
    return value


def encode_line(record: Mapping[str, Any]) -> bytes:
    """One compact JSON line; NaN/inf are refused (they are not JSON)."""
    return (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()


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
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        self._size = os.fstat(self._fd).st_size
        self.capped = self._size + MARKER_RESERVE_BYTES >= max_bytes
        self.lines_written = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str], rank_label: str) -> EvidenceWriter | None:
        """A writer when ``AFD_EVIDENCE_DIR`` is set, else None (evidence off)."""
        directory = environ.get(EVIDENCE_DIR_ENV)
        if not directory:
            return None
        return cls(directory, rank_label, max_bytes=max_bytes_from_env(environ))

    def _write_whole(self, line: bytes) -> None:
        written = os.write(self._fd, line)
        if written != len(line):  # regular files write fully or raise; say so if not
            raise OSError(f"{self.path}: short append ({written} of {len(line)} bytes)")
        self._size += written

    def append(self, record: Mapping[str, Any]) -> bool:
        """Append ``record`` as one line; False once the cap stopped the writer."""
        if self.capped:
            return False
        line = encode_line(record)
        if self._size + len(line) + MARKER_RESERVE_BYTES > self.max_bytes:
            marker = encode_line({
                "kind": CAP_MARKER_KIND,
                "format": EVIDENCE_FORMAT,
                "max_bytes": self.max_bytes,
                "lines_written": self.lines_written,
                "first_dropped_step": record.get("step"),
            })
            if len(marker) > MARKER_RESERVE_BYTES:
                raise AssertionError(f"cap marker of {len(marker)} bytes exceeds its reserve")
            self._write_whole(marker)
            self.capped = True
            return False
        self._write_whole(line)
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
