"""The ``afd_results`` writer and the summary rows of written results."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_afd.results import profile_ledger
from pytest_afd.results.directory import results_written_since
from pytest_afd.results.documents import (
    CASE_KINDS,
    ResultValidationError,
    build_result,
    headline,
    validate_result,
)
from pytest_afd.results.manifest import absent
from pytest_afd.results.shared import write_claimed_result
from pytest_afd.results.stand_in import STAND_IN_REASON, as_stand_in
from pytest_afd.run import outcomes
from pytest_afd.run.session import AfdSession, write_error
from pytest_afd.topology.spec import parse_topology


def case_kind(item: pytest.Item) -> str:
    """The first gate/stage marker on the test, else ``"other"``."""
    for kind in CASE_KINDS:
        if item.get_closest_marker(kind) is not None:
            return kind
    return "other"


def summary_entry(doc: dict[str, Any], nodeid: str, path: Path) -> dict[str, Any]:
    """One row of summary.json and of the terminal table for a written result."""
    metric, median, cv, unit = headline(doc)
    return {
        "case_id": doc["case_id"],
        "nodeid": nodeid,
        "case_kind": doc["case_kind"],
        "path": str(path),
        "metric": metric,
        "median": median,
        "cv": cv,
        "unit": unit,
        "synthetic": doc["labels"]["synthetic"],
        "comparability": doc["labels"]["comparability"],
        "manifest_digest": doc["manifest_digest"],
        profile_ledger.ENTRY_KEY: profile_ledger.status_of(doc),
    }


def recover_lost_results(state: AfdSession) -> None:
    """Results a dead worker wrote this session, read back from the results dir."""
    listed = {entry["case_id"] for entry in state.written}
    session_id = outcomes.tracker(state.config).session_id
    for path, doc in results_written_since(state.options.results_dir, state.started_at):
        if doc["case_id"] in listed or doc.get("session_id") != session_id:
            continue  # listed already, or another session's result in a shared directory
        owners = [nodeid for nodeid in state.outcomes if doc["case_id"].startswith(nodeid)]
        entry = summary_entry(doc, max(owners, key=len, default=doc["case_id"]), path)
        state.written.append({**entry, "recovered": True})


CPU_BACKEND = "cpu"


def stand_in_labels(fields: dict[str, Any], device: str | None) -> dict[str, Any]:
    """Label a case emulated everywhere when the harness's own server ran it (``device``).

    The manifest says emulated, the result is exploratory with the reason, and a
    gate's ``cpu_emulation`` evidence is present exactly when the manifest says
    emulated (absent with the reason on real devices).
    """
    manifest = fields["manifest"]
    if device is not None:
        emulation = parse_topology(manifest["topology"]["canonical"]).cpu_emulation().to_json()
        manifest = as_stand_in(manifest, device, emulation)
        fields = {**fields, "manifest": manifest}
    if manifest["hardware"]["emulated"] and fields.get("backend") != CPU_BACKEND:
        # A hardware backend's case on the harness's own server (said here or by the server).
        labels = dict(fields.get("labels") or {})
        labels.update(comparability="exploratory", comparability_reason=STAND_IN_REASON.format(
            device=device or manifest["hardware"]["device_type"]))
        fields = {**fields, "labels": labels}
    gate = (fields.get("evidence") or {}).get("gate")
    if isinstance(gate, dict) and "cpu_emulation" in gate and not manifest["hardware"]["emulated"]:
        gate = {**gate, "cpu_emulation": absent("runs on real devices, not emulated")}
        fields = {**fields, "evidence": {**fields["evidence"], "gate": gate}}
    return fields


@dataclass
class ResultWriter:
    """The ``afd_results`` fixture: one validated, atomically written result JSON per case."""

    state: AfdSession
    case_id: str
    case_kind: str
    written: list[str] = field(default_factory=list)

    @property
    def results_dir(self) -> Path:
        return self.state.options.results_dir

    def build(self, *, case_suffix: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """:func:`pytest_afd.results.documents.build_result` with case id, kind, backend, protocol and manifest filled in."""
        opts = self.state.options
        defaults = {
            "case_id": self.case_id if case_suffix is None else f"{self.case_id}/{case_suffix}",
            "case_kind": self.case_kind,
            "backend": opts.backend,
            "protocol": {
                k: v
                for k, v in opts.protocol().items()
                if k in ("seed", "warmups", "repetitions", "run_order")
            },
        }
        if "manifest" not in kwargs:
            defaults["manifest"] = self.state.manifest()
        return build_result(**stand_in_labels({**defaults, **kwargs}, self.state.stand_in_device()))

    def write(self, doc: dict[str, Any]) -> Path:
        """Validate and write ``doc``; an invalid result fails the test with the validation error."""
        if doc.get("case_id") in self.written:
            pytest.fail(
                f"result {doc['case_id']!r} written twice: one result per case", pytrace=False
            )
        doc = outcomes.tracker(self.state.config).stamp(doc)
        failure = None
        try:
            validate_result(doc)
            path = write_claimed_result(self.results_dir, doc)
        except ResultValidationError as exc:
            failure = str(exc)
        except OSError as exc:  # a full disk: this test fails, by name, without a traceback
            where = Path(exc.filename) if exc.filename else self.results_dir
            failure = write_error(where, exc, f"result {doc['case_id']!r} is lost")
            self.state.write_errors.append(failure)
        if failure is not None:  # outside the except: no chained traceback in the report
            pytest.fail(failure, pytrace=False)
        self.written.append(doc["case_id"])
        self.state.written.append(summary_entry(doc, self.case_id, path))
        self.state.config.hook.pytest_afd_result_written(
            config=self.state.config, path=path, result=doc
        )
        return path

    def record(self, **kwargs: Any) -> Path:
        """Build (see :meth:`build`) and write in one call."""
        return self.write(self.build(**kwargs))
