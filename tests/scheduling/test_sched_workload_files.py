"""Issue 23 row 14: a workload file is refused up front by its real cause, with exit 2.

A 3 GB file without a newline (a sparse file here: no real data is written)
was read whole into memory (MemoryError, rc 1, the code of an invalid plan); a
FIFO was called missing. Now the size is checked before any read and the file
type is named, each as an argparse-style error (exit 2).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pytest_afd.scheduling.cli import MAX_WORKLOAD_BYTES, main

SPARSE_SIZE = 3 * 1024**3
SUBPROCESS_TIMEOUT_S = 120


def _exit_2(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--chunk", "8192"])
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_a_3gb_file_without_a_newline_is_refused_before_it_is_read(tmp_path, capsys):
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as handle:
        handle.truncate(SPARSE_SIZE)  # sparse: 3 GB of apparent size, no blocks written
    assert huge.stat().st_size == SPARSE_SIZE
    err = _exit_2(capsys, "--workload", str(huge))
    assert f"is {SPARSE_SIZE} bytes, more than the limit {MAX_WORKLOAD_BYTES} bytes" in err
    assert "Traceback" not in err and "MemoryError" not in err


def test_the_console_run_exits_2_on_a_huge_file_without_a_traceback(tmp_path):
    huge = tmp_path / "huge.csv"
    with huge.open("wb") as handle:
        handle.truncate(SPARSE_SIZE)
    result = subprocess.run(
        [sys.executable, "-m", "pytest_afd.scheduling.cli", "--workload", str(huge),
         "--chunk", "8192"],
        capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S, check=False)
    assert result.returncode == 2
    assert "more than the limit" in result.stderr and "Traceback" not in result.stderr


def test_a_fifo_is_named_as_one_and_nothing_waits_for_a_writer(tmp_path, capsys):
    fifo = tmp_path / "queue.jsonl"
    os.mkfifo(fifo)
    err = _exit_2(capsys, "--workload", str(fifo))
    assert "is a FIFO (named pipe), not a regular file" in err and "does not exist" not in err


def test_a_directory_or_a_missing_file_is_named_by_its_cause(tmp_path, capsys):
    assert "is a directory, not a regular file" in _exit_2(capsys, "--workload", str(tmp_path))
    assert "does not exist" in _exit_2(capsys, "--workload", str(tmp_path / "none.jsonl"))


def test_binary_content_is_refused_as_not_text(tmp_path, capsys):
    binary = tmp_path / "q.jsonl"
    binary.write_bytes(b"\xff\xfe\x00100\n")
    assert "is not UTF-8 text" in _exit_2(capsys, "--workload", str(binary))


def test_a_file_at_the_limit_is_still_read(tmp_path, capsys):
    queue = tmp_path / "q.jsonl"
    queue.write_text("100\n200\n")
    assert main(["--workload", str(queue), "--chunk", "8192"]) == 0
    assert "valid" in capsys.readouterr().out
