"""The bundle's inputs and plain files: results read and checked against the study, raw copies with
their digests, and the summary tables (Markdown and CSV) the regions are made from.

Results are read with the report's loader (every session: a study spans
sessions; unusable files listed with their reason). A result whose manifest
contradicts the frozen study (``pytest_afd.study.check.contradictions``), or
that recorded another study's digest, is excluded and named with each field,
the study's value and the run's value.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_afd.report.loading import load_results
from pytest_afd.report.scan import read_json
from pytest_afd.report.tables import fmt
from pytest_afd.report.values import hit_ratios, mean_imbalance, median_of, ttft_of
from pytest_afd.results.documents import ResultValidationError, validate_result
from pytest_afd.study.limitations import (
    Contradicted,
    Exclusion,
    is_emulated,
    is_instrumented,
    layer_count,
    routing,
)

RAW_DIR = "raw"
SUMS_FILE = "SHA256SUMS"
STUDY_KEY = "study"
GATE_KIND = "gate"


class PublishError(ValueError):
    """A publication input that cannot be used (named with where it came from)."""


@dataclass
class Inputs:
    included: list[tuple[Path, dict[str, Any]]] = field(default_factory=list)
    excluded: list[Exclusion] = field(default_factory=list)
    unusable: list[tuple[Path, str]] = field(default_factory=list)


def _files_of(source: Path) -> tuple[list[tuple[Path, dict[str, Any]]], list[tuple[Path, str]]]:
    if source.is_dir():
        loaded = load_results(source)
        return [(r.path, dict(r.doc)) for r in loaded.results], list(loaded.skipped)
    if not source.is_file():
        raise PublishError(f"results path {source} (RESULTS argument) does not exist")
    try:
        doc = read_json(source)
        validate_result(doc)
    except (ValueError, ResultValidationError) as exc:
        return [], [(source, str(exc).splitlines()[0])]
    return [(source, doc)], []


def study_contradictions(study: Mapping[str, Any], doc: Mapping[str, Any]) -> list[Contradicted]:
    """The frozen study's check, plus a study digest recorded by the run that is neither this
    study's nor an ancestor's (gates and Stage A run under the study select-references derived from).
    """
    from pytest_afd.study.check import SCOPE_ALL, SCOPE_STACK, contradictions  # lazy: tolerances
    from pytest_afd.study.document import belongs

    # A gate checks correctness on layouts and small models of its own: stack and tolerances only,
    # as the plugin checks it when it runs (pytest_afd.study.check.SCOPE_STACK).
    scope = SCOPE_STACK if doc["case_kind"] == GATE_KIND else SCOPE_ALL
    found = [Contradicted(c.field, c.study_value, c.run_value)
             for c in contradictions(study, doc["manifest"], scope=scope)]
    recorded = doc["manifest"].get(STUDY_KEY)
    if isinstance(recorded, Mapping) and not belongs(study, str(recorded.get("digest"))):
        found.append(Contradicted("digest", study["digest"], recorded.get("digest")))
    return found


BUNDLE_MARKERS = ("regions.json", SUMS_FILE)


def in_bundle(path: Path, source: Path) -> bool:
    """Whether ``path`` lies in an earlier bundle under ``source`` (its raw/ copies are not new results)."""
    top = source.resolve()
    for parent in path.resolve().parents:
        if all((parent / marker).is_file() for marker in BUNDLE_MARKERS):
            return True
        if parent == top:
            return False
    return False


def read_inputs(sources: Sequence[Path], study: Mapping[str, Any]) -> Inputs:
    """Every result under ``sources`` once: a file is known by its bytes' digest (the same result
    given twice, or copied, must not count its repetitions twice), earlier bundles skipped."""
    inputs = Inputs()
    seen: set[str] = set()
    for source in sources:
        found, unusable = _files_of(source)
        inputs.unusable += [(p, why) for p, why in unusable if not in_bundle(p, source)]
        for path, doc in found:
            digest = sha256_of(path)
            if digest in seen or in_bundle(path, source):
                continue
            seen.add(digest)
            contradicted = study_contradictions(study, doc)
            if contradicted:
                inputs.excluded.append(Exclusion(doc["case_id"], str(path), tuple(contradicted)))
            else:
                inputs.included.append((path, doc))
    return inputs


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy_raw(inputs: Inputs, output: Path) -> list[tuple[str, str]]:
    """Every read result (included and excluded) byte for byte under raw/; (bundle path, sha256)."""
    raw = output / RAW_DIR
    raw.mkdir(parents=True, exist_ok=True)
    sources = [path for path, _ in inputs.included] + [Path(e.source) for e in inputs.excluded]
    copied = []
    for index, path in enumerate(sources):
        target = raw / f"{index:04d}-{path.name}"
        target.write_bytes(path.read_bytes())
        copied.append((f"{RAW_DIR}/{target.name}", sha256_of(target)))
    return copied


def write_sums(output: Path) -> Path:
    """``sha256sum -c``-compatible digests of every file in the bundle (itself excluded)."""
    lines = [f"{sha256_of(path)}  {path.relative_to(output).as_posix()}"
             for path in sorted(output.rglob("*")) if path.is_file() and path.name != SUMS_FILE]
    target = output / SUMS_FILE
    target.write_text("\n".join(lines) + "\n")
    return target


# ---- tables ---------------------------------------------------------------------------------
CASE_HEADER = ("case", "stage", "policy", "workload", "realized imbalance", "realized hit",
               "tokens/s (median)", "TTFT p50 s (median)", "repetitions", "layers", "routing",
               "emulated", "instrumented", "session", "outcome")


def case_rows(docs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for doc in sorted(docs, key=lambda d: d["case_id"]):
        _, realized = hit_ratios(doc)
        reps = doc["metrics"]["prefill_tokens_per_s"]
        rows.append([doc["case_id"], doc["case_kind"], doc["settings"]["split_policy"],
                     doc["workload"]["dataset"]["name"], fmt(mean_imbalance(doc)), fmt(realized),
                     fmt(median_of(reps), 6), fmt(median_of(ttft_of(doc, "p50")), 6),
                     str(len(reps.get("repetitions", []))), str(layer_count(doc) or "-"),
                     routing(doc), "yes" if is_emulated(doc) else "no",
                     "yes" if is_instrumented(doc) else "no", str(doc.get("session_id", "-")),
                     doc.get("outcome", {}).get("status", "unknown")])
    return rows


def csv_text(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()
