"""Collect the Attention ranks' evidence lines of one case into its RunOutputs.

The hook (afd_split.integrations) appends one JSON line per prefill step to one
file per Attention rank under ``AFD_EVIDENCE_DIR``. Around each case the
backend notes every file's size before and reads what was appended after, so a
case gets exactly its own steps. Only whole lines count: an incomplete last
line (a writer mid-append or killed) is left for the next read and reported; a
cap marker, a bad line or a file over the read limit is reported by name, and
a case with any such problem gets no step evidence (absent with the reason)
instead of partial steps that would under-count tokens.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from afd_split.integrations.worker_evidence import (
    CAP_MARKER_KIND,
    EVIDENCE_FORMAT,
    FILE_SUFFIX,
    RECORD_KIND,
    EvidenceSettings,
)
from pytest_afd.backends.base import PromptRequest, RunOutputs, RunSettings

STEP_FIELDS_REQUIRED = ("policy", "split_token", "ubatches", "imbalance", "ranks", "step")


@dataclass
class WorkerEvidence:
    """Step records of one case (replica leaders first by DP rank) and what went wrong."""

    records: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def leader_records(self) -> list[dict[str, Any]]:
        """One record per step per DP replica (TP rank 0, PCP rank 0), in DP-rank order."""
        leaders = [r for r in self.records
                   if r["ranks"]["tp_rank"] == 0 and r["ranks"]["pcp_rank"] == 0]
        return sorted(leaders, key=lambda r: (r["ranks"]["dp_rank"], r["step"]))


def evidence_files(directory: Path) -> list[Path]:
    """The rank files under ``directory`` (sorted; none when it does not exist yet).

    A symlink is never a rank file (the writers refuse to write through one), so a
    planted link cannot make a case read another file as its evidence.
    """
    if not directory.is_dir():
        return []
    return sorted(path for path in directory.iterdir()
                  if path.suffix == FILE_SUFFIX and not path.is_symlink() and path.is_file())


def snapshot_offsets(directory: Path) -> dict[str, int]:
    """Current size of every rank file: where this case's lines will start."""
    return {path.name: path.stat().st_size for path in evidence_files(directory)}


def _parse_line(raw: bytes, where: str, problems: list[str]) -> dict[str, Any] | None:
    try:
        record = json.loads(raw)
    except ValueError as error:
        problems.append(f"{where}: not JSON ({error})")
        return None
    if not isinstance(record, dict):
        problems.append(f"{where}: a JSON {type(record).__name__}, not an object")
        return None
    if record.get("format") != EVIDENCE_FORMAT:
        problems.append(f"{where}: format {record.get('format')!r}, expected {EVIDENCE_FORMAT}")
        return None
    if record.get("kind") == CAP_MARKER_KIND:
        problems.append(f"{where}: the writer hit its {record.get('max_bytes')}-byte cap; steps "
                        f"from {record.get('first_dropped_step')} on are missing")
        return None
    missing = [name for name in STEP_FIELDS_REQUIRED if name not in record]
    if record.get("kind") != RECORD_KIND or missing:
        problems.append(f"{where}: kind {record.get('kind')!r}, missing fields {missing}")
        return None
    return record


def read_new_records(directory: Path, offsets: Mapping[str, int], *,
                     max_read_bytes: int) -> WorkerEvidence:
    """Whole lines appended to each rank file since ``offsets``."""
    evidence = WorkerEvidence()
    for path in evidence_files(directory):
        start = offsets.get(path.name, 0)
        size = path.stat().st_size
        if size < start:
            evidence.problems.append(f"{path}: shrank from {start} to {size} bytes during the case")
            continue
        if size - start > max_read_bytes:
            evidence.problems.append(f"{path}: {size - start} new bytes exceed the "
                                     f"{max_read_bytes}-byte read limit; not read")
            continue
        with path.open("rb") as handle:
            handle.seek(start)
            chunk = handle.read(size - start)
        whole, _, partial = chunk.rpartition(b"\n")
        if partial:
            evidence.problems.append(f"{path}: incomplete last line ({len(partial)} bytes "
                                     "without a newline: a writer is mid-append or died)")
        if not whole:
            continue
        for number, raw in enumerate(whole.split(b"\n"), start=1):
            record = _parse_line(raw, f"{path}:+{number}", evidence.problems)
            if record is not None:
                evidence.records.append(record)
    return evidence


def summed_expert_load(records: Sequence[Mapping[str, Any]]) -> list[list[int]] | None:
    """Per-layer per-expert routed tokens over ``records``; None unless every record has it."""
    total: list[list[int]] | None = None
    for record in records:
        load = record["expert_load"]
        if not isinstance(load, list):
            return None
        if total is None:
            total = [list(map(int, layer)) for layer in load]
            continue
        if len(load) != len(total) or any(
            len(a) != len(b) for a, b in zip(load, total, strict=True)
        ):
            return None
        total = [[a + int(b) for a, b in zip(acc, layer, strict=True)]
                 for acc, layer in zip(total, load, strict=True)]
    return total


def with_worker_evidence(outputs: RunOutputs, evidence: WorkerEvidence) -> RunOutputs:
    """``outputs`` carrying the case's steps and expert load; unchanged when any problem."""
    leaders = evidence.leader_records
    if evidence.problems or not leaders:
        return outputs
    load = summed_expert_load(leaders)
    return replace(outputs, steps=[dict(record) for record in leaders],
                   expert_load=load if load is not None else outputs.expert_load)


class WorkerEvidenceBackend:
    """A backend whose runs also collect the Attention ranks' evidence lines of each case."""

    def __init__(self, inner, directory: str | os.PathLike[str], *,
                 max_read_bytes: int) -> None:
        self._inner = inner
        self.directory = Path(directory)
        self.max_read_bytes = max_read_bytes
        self.last_problems: list[str] = []

    @classmethod
    def wrap_from_env(cls, inner, environ: Mapping[str, str]):
        """``inner`` wrapped when ``AFD_EVIDENCE_DIR`` is set, else ``inner`` itself."""
        settings = EvidenceSettings.from_env(environ)  # bad values fail here, at start-up
        if settings is None:
            return inner
        return cls(inner, settings.directory, max_read_bytes=settings.max_bytes)

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def capabilities(self) -> frozenset[str]:
        return self._inner.capabilities

    def run(self, prompts: Sequence[PromptRequest], settings: RunSettings) -> RunOutputs:
        offsets = snapshot_offsets(self.directory)
        outputs = self._inner.run(prompts, settings)
        evidence = read_new_records(self.directory, offsets, max_read_bytes=self.max_read_bytes)
        self.last_problems = evidence.problems
        return with_worker_evidence(outputs, evidence)

    def reset_prefix_cache(self) -> None:
        self._inner.reset_prefix_cache()

    def describe(self) -> dict[str, Any]:
        description = dict(self._inner.describe())
        description["worker_evidence"] = {"dir": str(self.directory),
                                          "last_problems": list(self.last_problems)}
        return description

    def close(self) -> None:
        self._inner.close()
