"""Workload files of ``afd-chunk-plan``: JSONL or an Azure trace CSV, read within bounds.

A file is refused by its real cause before anything is parsed: missing, not a
regular file (a FIFO, a directory, a device), over ``MAX_WORKLOAD_BYTES``, or
not UTF-8; every bad line is named ``path:line``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from pytest_afd.scheduling.arguments import MAX_PROMPT_LEN

AZURE_PROMPT_COLUMN = "ContextTokens"
JSONL_PROMPT_KEY = "prompt_len"
JSONL_CACHED_KEY = "cached_prefix"
MAX_WORKLOAD_BYTES = 64 * 1024 * 1024
"""Largest workload file read (checked before reading): ~1M Azure trace rows, far more
than MAX_NUM_REQUESTS JSONL lines; a bigger (or unbounded) file is refused, not loaded."""


@dataclass(frozen=True)
class QueueEntry:
    prompt_len: int
    requested_cached: int | None = None


def _positive_field(value: object, where: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {what} {value!r} is not a positive integer")
    if value > MAX_PROMPT_LEN:
        raise ValueError(f"{where}: {what} {value} is more than the limit {MAX_PROMPT_LEN}")
    return value


def _read_azure_csv(path: Path, text: str) -> list[QueueEntry]:
    with io.StringIO(text, newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or AZURE_PROMPT_COLUMN not in reader.fieldnames:
            raise ValueError(f"{path}: CSV has no {AZURE_PROMPT_COLUMN} column")
        entries = []
        for line, row in enumerate(reader, start=2):
            text = row[AZURE_PROMPT_COLUMN]
            try:
                value = int(text)
            except (TypeError, ValueError):
                raise ValueError(
                    f"{path}:{line}: {AZURE_PROMPT_COLUMN} {text!r} is not an integer"
                ) from None
            entries.append(QueueEntry(_positive_field(value, f"{path}:{line}", "prompt length")))
    return entries


def _read_jsonl(path: Path, content: str) -> list[QueueEntry]:
    entries = []
    for line, text in enumerate(content.splitlines(), start=1):
        if not text.strip():
            continue
        where = f"{path}:{line}"
        try:
            item = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not JSON ({error.msg})") from None
        if isinstance(item, dict):
            if JSONL_PROMPT_KEY not in item:
                raise ValueError(f"{where}: object has no {JSONL_PROMPT_KEY!r}")
            cached = item.get(JSONL_CACHED_KEY)
            if cached is not None and (
                isinstance(cached, bool) or not isinstance(cached, int) or cached < 0
            ):
                raise ValueError(f"{where}: {JSONL_CACHED_KEY} {cached!r} is not an integer >= 0")
            entries.append(
                QueueEntry(_positive_field(item[JSONL_PROMPT_KEY], where, "prompt length"), cached)
            )
        else:
            entries.append(QueueEntry(_positive_field(item, where, "prompt length")))
    return entries


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def read_workload_text(path: Path, limit: int = MAX_WORKLOAD_BYTES) -> str:
    """The file's text, refused by its real cause: missing, not a regular file, over ``limit``.

    The size is checked on the open descriptor before anything is read
    (``O_NONBLOCK``: opening a FIFO does not wait for a writer), and at most
    ``limit + 1`` bytes are ever read, so a file that grows meanwhile is refused too.
    """
    name = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ValueError(f"workload file {name!r} does not exist") from None
    except OSError as error:
        raise ValueError(f"workload file {name!r} cannot be opened: "
                         f"{error.strerror or error}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"workload file {name!r} is {_file_kind(info.st_mode)}, "
                             "not a regular file")
        raise ValueError(f"workload file {name!r} is {info.st_size} bytes, more than the "
                         f"limit {limit} bytes")
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as error:
            raise ValueError(f"workload file {name!r} cannot be read: "
                             f"{error.strerror or error}") from None
    if len(data) > limit:
        raise ValueError(f"workload file {name!r} grew past the limit {limit} bytes while read")
    try:
        return data.decode()
    except UnicodeDecodeError as error:
        raise ValueError(f"workload file {name!r} is not UTF-8 text ({error.reason} at "
                         f"byte {error.start})") from None


def load_workload(path: Path) -> list[QueueEntry]:
    """Prompt lengths (and optional requested cached prefixes) from JSONL or an Azure CSV."""
    text = read_workload_text(path)
    first_line = text.split("\n", 1)[0]
    is_csv = path.suffix.lower() == ".csv" or AZURE_PROMPT_COLUMN in first_line
    entries = _read_azure_csv(path, text) if is_csv else _read_jsonl(path, text)
    if not entries:
        raise ValueError(f"workload file {str(path)!r} holds no requests")
    return entries
