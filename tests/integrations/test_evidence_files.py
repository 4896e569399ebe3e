"""Evidence files under hostile directories and many writers: no symlink followed, one cap for all.

Rows 6 and 11 of issue 23: a planted symlink or FIFO is refused by name; four
processes appending to one file stay under its cap with one marker; a bad
``AFD_EVIDENCE_DIR`` or ``AFD_EVIDENCE_MAX_BYTES`` is refused once, when the
backend starts, naming the variable and value.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re

import numpy as np
import pytest

from afd_split import SplitConstraints
from afd_split.hook.planning.engine_step import StepRanks, plan_engine_step, step_record
from afd_split.hook.planning.worker_evidence import (
    CAP_MARKER_KIND,
    EVIDENCE_DIR_ENV,
    MAX_BYTES_ENV,
    EvidenceSettings,
    EvidenceWriter,
    encode_line,
    max_bytes_from_env,
)
from pytest_afd.backends.cpu.backend import CpuBackend
from pytest_afd.backends.vllm_ascend.worker_evidence import WorkerEvidenceBackend, read_new_records

pytest_plugins = ["pytester"]

SHARED_CAP = 8192
WRITERS = 4
STEPS_PER_WRITER = 60


def _record(step: int) -> dict:
    plan = plan_engine_step([30, 10], policy="token_balanced", constraints=SplitConstraints(),
                            num_computed_tokens=[0, 4])
    return step_record(plan, step=step, ranks=StepRanks(global_rank=0, dp_rank=0, tp_rank=0),
                       expert_load=np.asarray([[1, 2], [3, 4]]))


def test_a_planted_symlink_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_bytes(b"keep me\n")
    evidence_dir = tmp_path / "evidence"
    evidence_dir.mkdir()
    (evidence_dir / "attention-rank0.jsonl").symlink_to(target)
    with pytest.raises(OSError, match=r"attention-rank0\.jsonl: evidence file is a symlink"):
        EvidenceWriter(evidence_dir, "attention-rank0")
    dangling = evidence_dir / "attention-rank1.jsonl"
    dangling.symlink_to(tmp_path / "created-through-the-link")
    with pytest.raises(OSError, match="is a symlink"):
        EvidenceWriter(evidence_dir, "attention-rank1")
    assert target.read_bytes() == b"keep me\n"
    assert not (tmp_path / "created-through-the-link").exists()
    target.write_text('{"kind": "afd_step", "format": 1}\n')  # the reader skips links too
    assert read_new_records(evidence_dir, {}, max_read_bytes=1 << 20).problems == []


def test_a_fifo_or_directory_in_place_of_the_file_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "attention-rank0.jsonl")
    reader = os.open(tmp_path / "attention-rank0.jsonl", os.O_RDONLY | os.O_NONBLOCK)
    try:  # with a reader the open succeeds, so the type check on the descriptor must refuse
        with pytest.raises(OSError, match=r"not a regular file \(mode p"):
            EvidenceWriter(tmp_path, "attention-rank0")
    finally:
        os.close(reader)
    with pytest.raises(OSError, match="cannot open the evidence file"):  # no reader: ENXIO
        EvidenceWriter(tmp_path, "attention-rank0")
    (tmp_path / "attention-rank1.jsonl").mkdir()
    with pytest.raises(OSError, match=r"attention-rank1\.jsonl"):
        EvidenceWriter(tmp_path, "attention-rank1")


def _append_steps(directory: str, start: multiprocessing.synchronize.Event) -> None:
    start.wait(timeout=60)
    with EvidenceWriter(directory, "attention-rank0", max_bytes=SHARED_CAP) as writer:
        for step in range(STEPS_PER_WRITER):
            writer.append(_record(step))


def test_four_processes_sharing_one_file_stay_under_its_cap_with_one_marker(tmp_path):
    assert WRITERS * STEPS_PER_WRITER * len(encode_line(_record(10))) > 4 * SHARED_CAP
    context = multiprocessing.get_context("fork")
    start = context.Event()
    workers = [context.Process(target=_append_steps, args=(str(tmp_path), start))
               for _ in range(WRITERS)]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    data = (tmp_path / "attention-rank0.jsonl").read_bytes()
    assert len(data) <= SHARED_CAP
    lines = [json.loads(line) for line in data.splitlines()]
    assert [line["kind"] for line in lines].count(CAP_MARKER_KIND) == 1
    assert lines[-1]["kind"] == CAP_MARKER_KIND
    evidence = read_new_records(tmp_path, {}, max_read_bytes=1 << 20)
    assert len(evidence.records) == len(lines) - 1
    assert len(evidence.problems) == 1 and "8192-byte cap" in evidence.problems[0]
    reopened = EvidenceWriter(tmp_path, "attention-rank0", max_bytes=SHARED_CAP)
    assert reopened.capped and reopened.append(_record(0)) is False
    reopened.close()


def test_a_writer_opened_before_another_capped_the_file_writes_no_second_marker(tmp_path):
    line_bytes = len(encode_line(_record(0)))
    cap = 4 * line_bytes + 600
    early = EvidenceWriter(tmp_path, "attention-rank0", max_bytes=cap)
    late = EvidenceWriter(tmp_path, "attention-rank0", max_bytes=cap)
    while late.append(_record(1)):
        pass
    assert early.append(_record(2)) is False and early.capped
    data = (tmp_path / "attention-rank0.jsonl").read_bytes()
    assert data.count(CAP_MARKER_KIND.encode()) == 1 and len(data) <= cap
    early.close()
    late.close()


@pytest.mark.parametrize("raw", ["1_0_0_0_0", "64MB", " 8192", "+8192", "8192 ", "８１９２"])
def test_a_cap_that_is_not_plain_digits_is_refused_by_name(raw):
    with pytest.raises(ValueError,
                       match=re.escape(f"{MAX_BYTES_ENV}={raw!r} is not an integer byte count")):
        max_bytes_from_env({MAX_BYTES_ENV: raw})


def test_a_bad_directory_is_refused_naming_the_variable(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(ValueError, match=f"{EVIDENCE_DIR_ENV}='{a_file}' is not a directory"):
        EvidenceSettings.from_env({EVIDENCE_DIR_ENV: str(a_file)})
    under_a_file = a_file / "evidence"
    with pytest.raises(ValueError, match=f"{EVIDENCE_DIR_ENV}='{under_a_file}' cannot be created"):
        EvidenceSettings.from_env({EVIDENCE_DIR_ENV: str(under_a_file)})
    assert EvidenceSettings.from_env({}) is None
    settings = EvidenceSettings.from_env({EVIDENCE_DIR_ENV: str(tmp_path / "new"),
                                          MAX_BYTES_ENV: "8192"})
    assert settings.max_bytes == 8192 and settings.directory.is_dir()


@pytest.mark.parametrize(("variable", "value", "message"), [
    (MAX_BYTES_ENV, "64MB", "is not an integer byte count"),
    (EVIDENCE_DIR_ENV, "{file}", "is not a directory"),
])
def test_bad_evidence_settings_fail_when_a_backend_starts(tmp_path, monkeypatch, variable,
                                                          value, message):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    value = value.format(file=a_file)
    monkeypatch.setenv(EVIDENCE_DIR_ENV, str(tmp_path / "evidence"))
    monkeypatch.setenv(variable, value)
    expected = re.escape(f"{variable}={value!r} {message}")
    with pytest.raises(ValueError, match=expected):
        CpuBackend.__new__(CpuBackend).__init__(model=_NoModel())
    with pytest.raises(ValueError, match=expected):
        WorkerEvidenceBackend.wrap_from_env(object(), os.environ)


class _NoModel:
    """Enough of a model for the backend's constructor, which touches only its config."""

    quantization = "bf16"
    routing = "natural"
    config = None


PLUGIN_ENTRY_POINT = "afd"
"""The pytest11 entry point name (pyproject.toml)."""
PLUGIN_MODULE = "pytest_afd.plugin"


def test_a_bad_evidence_setting_is_a_usage_error_when_pytest_starts(pytester, monkeypatch):
    """Refused once, before any test runs (it used to fail every case's run).

    The inner run loads the plugin by module name whichever way the outer run got it (its
    ``afd`` entry point in the default run; none in the optional real-vLLM env, which
    runs with ``-p no:afd`` and without the project installed), and blocks the entry
    point so it is never registered twice.
    """
    monkeypatch.setenv(EVIDENCE_DIR_ENV, str(pytester.path / "evidence"))
    monkeypatch.setenv(MAX_BYTES_ENV, "1_0_0_0_0")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", f"no:{PLUGIN_ENTRY_POINT}",
                                "-p", PLUGIN_MODULE)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{MAX_BYTES_ENV}='1_0_0_0_0' is not an integer byte count*"])
