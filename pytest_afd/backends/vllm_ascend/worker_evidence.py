"""Collect the Attention ranks' evidence lines of one case into its RunOutputs.

The hook (afd_split.hook) appends one JSON line per prefill step to one
file per Attention rank under ``AFD_EVIDENCE_DIR``, and one expert-load line per
step (per-stage, per-layer, per-expert routed tokens) that is joined to its step
line by step number. Around each case the
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

from afd_split.hook.planning.expert_load import EXPERT_LOAD_KIND
from afd_split.hook.planning.worker_evidence import (
    CAP_MARKER_KIND,
    EVIDENCE_FORMAT,
    FILE_SUFFIX,
    RECORD_KIND,
    UNRECORDED_KIND,
    EvidenceSettings,
)
from pytest_afd.backends.vllm_ascend.request_join import join_requests
from pytest_afd.core.backend import PromptRequest, RunOutputs, RunSettings

STEP_FIELDS_REQUIRED = ("policy", "split_token", "ubatches", "imbalance", "ranks", "step")
EXPERT_LOAD_FIELDS_REQUIRED = ("step", "ranks", "routing", "layers", "expert_per_rank",
                               "per_stage", "plan_to_flush_s")


@dataclass
class WorkerEvidence:
    """Step records of one case (replica leaders first by DP rank) and what went wrong."""

    records: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unmatched_expert_load: int = 0
    """Expert-load lines of a step read in an earlier case (flushed at the next planning)."""

    @property
    def leader_records(self) -> list[dict[str, Any]]:
        """One record per step per DP replica (TP rank 0, PCP rank 0), in DP-rank order, its
        per-step expert load joined over the replica's PCP ranks (``join_pcp_ranks``).

        Within a replica the lines stay in append order, which is step order: a server
        that ran the case as several batches numbers each batch's steps from 0.
        """
        leaders = [r for r in self.records
                   if r["ranks"]["tp_rank"] == 0 and r["ranks"]["pcp_rank"] == 0]
        return join_pcp_ranks(sorted(leaders, key=lambda r: r["ranks"]["dp_rank"]),
                              self.expert_load_records)

    @property
    def expert_load_records(self) -> list[dict[str, Any]]:
        """The records whose routed counts add up (TP rank 0 of every DP replica and PCP
        rank): TP ranks route the same tokens, each PCP rank its own rows of the stage."""
        return [r for r in self.records if r["ranks"]["tp_rank"] == 0]


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
    if record.get("kind") == UNRECORDED_KIND:
        problems.append(f"{where}: step {record.get('step')} was not recorded by the "
                        f"evidence-only hook: {record.get('reason')}")
        return None
    required = EXPERT_LOAD_FIELDS_REQUIRED if record.get("kind") == EXPERT_LOAD_KIND \
        else STEP_FIELDS_REQUIRED
    missing = [name for name in required if name not in record]
    if record.get("kind") not in (RECORD_KIND, EXPERT_LOAD_KIND) or missing:
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
        steps, loads = [], []
        for number, raw in enumerate(whole.split(b"\n"), start=1):
            record = _parse_line(raw, f"{path}:+{number}", evidence.problems)
            if record is not None:
                (loads if record["kind"] == EXPERT_LOAD_KIND else steps).append(record)
        evidence.unmatched_expert_load += join_expert_load(steps, loads, str(path),
                                                           evidence.problems)
        evidence.records.extend(steps)
    return evidence


def join_expert_load(steps: list[dict[str, Any]], loads: Sequence[Mapping[str, Any]],
                     where: str, problems: list[str]) -> int:
    """Attach each expert-load line of one rank file to its step line (same step number):
    ``expert_load`` [layers][experts] summed over stages, per EP rank, per stage, routing.
    Returns how many lines have no step line here (a step read in an earlier case)."""
    by_step = {step["step"]: step for step in steps}
    unmatched = 0
    for load in loads:
        step = by_step.get(load["step"])
        if step is None:
            unmatched += 1
            continue
        per_stage = load["per_stage"]
        per_layer = [[sum(column) for column in zip(*layers, strict=True)]
                     for layers in zip(*per_stage, strict=True)]
        width = load["expert_per_rank"]
        if not per_layer or width is None or len(per_layer[0]) % width:
            problems.append(f"{where}: step {load['step']}: {len(per_layer[0]) if per_layer else 0}"
                            f" experts cannot be grouped by expert_per_rank={width}")
            continue
        step.update({
            "expert_load": per_layer,
            "expert_load_per_rank": [[sum(layer[r:r + width]) for r in range(0, len(layer), width)]
                                     for layer in per_layer],
            "expert_load_layers": list(load["layers"]),
            "expert_load_per_stage_tokens": [sum(map(sum, stage)) for stage in per_stage],
            "expert_load_routing": load["routing"],
            "plan_to_last_dispatch_s": load["plan_to_flush_s"],
        })
        # Real rows only (the hook's StageRows); padding rows and PCP decode copies that
        # reached the dispatch are reported apart, as the CPU backend's padding_routed_rows.
        step.update({f"expert_load_{name}": load[name] for name in ROW_COUNT_FIELDS
                     if name in load})
    return unmatched


NO_STEP_LINES = ("no Attention rank appended a step line during this case (the servers "
                 "need AFD_EVIDENCE_DIR set to the harness's directory and afd_split in "
                 "VLLM_PLUGINS on Attention; docs/ascend.md)")


ROW_COUNT_FIELDS = ("padding_routed_rows", "replicated_routed_rows")
"""Dispatched rows the expert-load line did not count (summed over stages and layers)."""

PER_STEP_LOAD_FIELDS = ("expert_load", "expert_load_per_rank", "expert_load_per_stage_tokens",
                        *(f"expert_load_{name}" for name in ROW_COUNT_FIELDS))
"""A step's routed counts; under PCP each PCP rank routes its own rows of every stage."""


def _summed(values: Sequence) -> Any:
    """Element-wise sum of equally shaped nested lists of ints."""
    if isinstance(values[0], list):
        return [_summed(list(column)) for column in zip(*values, strict=True)]
    return sum(int(value) for value in values)


def join_pcp_ranks(leaders: Sequence[Mapping[str, Any]],
                   loaded: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each leader's per-step expert load summed over its DP replica's PCP ranks.

    ``loaded`` are the TP-rank-0 records of every PCP rank. A step joins when every
    PCP rank the replica's files show has its counts for that step
    (``expert_load_pcp_ranks`` lists them; the dispatch time is the latest); otherwise
    its counts are absent with the missing ranks named, never one rank's rows shown
    as the step's.
    """
    by_step: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    replica_ranks: dict[int, set[int]] = {}
    for record in loaded:
        dp_rank, pcp_rank = record["ranks"]["dp_rank"], record["ranks"]["pcp_rank"]
        replica_ranks.setdefault(dp_rank, set()).add(pcp_rank)
        by_step.setdefault((dp_rank, record["step"]), []).append(record)
    joined = []
    for leader in leaders:
        step = dict(leader)
        dp_rank = step["ranks"]["dp_rank"]
        ranks = replica_ranks.get(dp_rank, {0})
        if len(ranks) > 1 and isinstance(step.get("expert_load"), list):
            rows = [r for r in by_step[dp_rank, step["step"]]
                    if isinstance(r.get("expert_load"), list)]
            have = sorted(r["ranks"]["pcp_rank"] for r in rows)
            if have == sorted(ranks):
                step.update({name: _summed([r[name] for r in rows]) for name in
                             PER_STEP_LOAD_FIELDS if all(name in r for r in rows)})
                if all("plan_to_last_dispatch_s" in r for r in rows):
                    step["plan_to_last_dispatch_s"] = max(r["plan_to_last_dispatch_s"]
                                                          for r in rows)
            else:
                for name in (*PER_STEP_LOAD_FIELDS[1:], "plan_to_last_dispatch_s"):
                    step.pop(name, None)
                step["expert_load"] = {"value": None, "absent_reason": (
                    f"PCP ranks {sorted(ranks - set(have))} have no expert load for step "
                    f"{step['step']} of DP replica {dp_rank}")}
            step["expert_load_pcp_ranks"] = have
        joined.append(step)
    return joined


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


def routing_problems(records: Sequence[Mapping[str, Any]], routing: str) -> list[str]:
    """The steps whose workers routed otherwise than the case says (a forced run must stay
    labelled synthetic, a natural one must not be forced)."""
    wrong = sorted({r["expert_load_routing"] for r in records
                    if r.get("expert_load_routing", routing) != routing})
    return [f"the workers routed {wrong} but the case's routing is {routing!r}"] if wrong else []


def with_worker_evidence(outputs: RunOutputs, evidence: WorkerEvidence,
                         routing: str | None = None) -> RunOutputs:
    """``outputs`` carrying the case's steps and expert load; unchanged when any problem
    (``routing``, the case's, is checked against the workers' own label when given)."""
    leaders = evidence.leader_records
    if routing is not None:
        evidence.problems.extend(routing_problems(evidence.records, routing))
    if evidence.problems:
        return replace(outputs, steps_absent_reason="the Attention ranks' evidence lines of "
                       "this case are unusable: " + "; ".join(evidence.problems))
    if not leaders:
        return replace(outputs, steps_absent_reason=NO_STEP_LINES)
    load = summed_expert_load(evidence.expert_load_records)
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
        join_requests(evidence.records, [prompt.request_id for prompt in prompts],
                      evidence.problems)
        joined = with_worker_evidence(outputs, evidence, settings.routing)
        self.last_problems = evidence.problems
        return joined

    def reset_prefix_cache(self) -> None:
        self._inner.reset_prefix_cache()

    def describe(self) -> dict[str, Any]:
        description = dict(self._inner.describe())
        description["worker_evidence"] = {"dir": str(self.directory),
                                          "last_problems": list(self.last_problems)}
        return description

    def close(self) -> None:
        self._inner.close()

    def __getattr__(self, name: str) -> Any:
        """Everything else (run counts, stand-in device, deployments) is the inner backend's."""
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)
