"""Build, validate and atomically write case results (``schemas/result.schema.json``).

Usable with or without pytest::

    from pytest_afd.results import documents as results
    doc = results.build_result(case_id="stage_a/bimodal/token_balanced", case_kind="stage_a",
                               backend="cpu", settings=run_settings, manifest=manifest,
                               workload=results.workload_json(...), protocol=run.protocol_json(),
                               metrics=results.metrics_json(...),
                               evidence=results.evidence_from_outputs(outputs, ...))
    results.write_result(results.result_path(results_dir, doc["case_id"]), doc)

``write_result`` validates first and raises :class:`ResultValidationError`
naming every offending JSON path; nothing is written for an invalid result.
A value that cannot be known is :func:`absent` (``{"value": null,
"absent_reason": ...}``), never omitted.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from pytest_afd.core.backend import RunSettings
from pytest_afd.results.fast_check import compiled_check
from pytest_afd.results.manifest import absent, manifest_digest, with_run  # noqa: F401 - absent re-exported
from pytest_afd.results.parts import (  # noqa: F401 - re-exported: results is the public module
    DEFAULT_ASYNC_MOE_STAGES,
    LAYOUT_FROM_TOPOLOGY,
    NOT_MEASURED,
    PROMPT_LENGTH_PERCENTILES,
    TTFT_PERCENTILES,
    evidence_from_outputs,
    measurement,
    metrics_from_runs,
    metrics_json,
    per_rank_load,
    prompt_length_summary,
    reported_peak_memory,
    settings_json,
    token_evidence,
    workload_json,
)
from pytest_afd.results.schema_refs import inlined_schema

SCHEMA_VERSION = "1.0.0"
# The checked-in schemas live in the repository's schemas/ (next to pytest_afd/
# in a checkout or editable install); a wheel installs them as data files.
SOURCE_SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"
INSTALLED_SCHEMAS_DIR = Path(sys.prefix) / "share" / "pytest-afd" / "schemas"


def schemas_dir() -> Path:
    """Where the schemas are: the source tree first, then the installed data files."""
    if SOURCE_SCHEMAS_DIR.is_dir():
        return SOURCE_SCHEMAS_DIR
    return INSTALLED_SCHEMAS_DIR


MANIFEST_SCHEMA_FILE = "manifest.schema.json"
RESULT_FILE_MODE = 0o644
RESULT_SCHEMA_FILE = "result.schema.json"
CASE_KINDS = (
    "gate",
    "stage_a",
    "stage_b",
    "stage_c",
    "stage_d",
    "stage_e",
    "stage_f",
    "benchmark",
    "other",
)
COMPARABILITY = ("comparable", "exploratory")
DEFAULT_HEADLINE_METRIC = "prefill_tokens_per_s"
# Longest readable part of a result file name; the rest is replaced by a digest.
MAX_FILE_STEM = 120
CASE_DIGEST_CHARS = 10


class ResultValidationError(ValueError):
    """A result or manifest does not match its schema; the message lists every error path."""


def is_absent(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and set(value) == {"value", "absent_reason"}
        and value["value"] is None
    )


@functools.cache
def load_schema(file_name: str) -> dict[str, Any]:
    path = schemas_dir() / file_name
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"schema {path} is missing (schemas/ ships next to pytest_afd/ or under <prefix>/share/pytest-afd/schemas)"
        ) from exc


@functools.cache
def _validator(file_name: str) -> Draft202012Validator:
    """The schema checked as written, then validated in its inlined form (``schema_refs``:
    the same errors, without resolving every ``$ref`` again at every use)."""
    manifest_schema = load_schema(MANIFEST_SCHEMA_FILE)
    schema = load_schema(file_name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(inlined_schema(schema, {manifest_schema["$id"]: manifest_schema}))


@functools.cache
def _compiled_check(file_name: str):
    """The compiled yes/no on the same inlined schema (``fast_check``), or ``None``."""
    return compiled_check(_validator(file_name).schema)


def _describe_error(error: ValidationError) -> str:
    where = "/" + "/".join(str(p) for p in error.absolute_path)
    detail = error.message
    if error.context:
        detail = f"{detail}; closest: {best_match(error.context).message}"
    return f"at {where}: {detail}"


def non_finite_paths(doc: Any, path: str = "") -> list[str]:
    """JSON-pointer paths of NaN / Infinity values (JSON Schema cannot refuse them)."""
    if isinstance(doc, float):
        return [] if math.isfinite(doc) else [path or "/"]
    if isinstance(doc, dict):
        return [p for key, value in doc.items() for p in non_finite_paths(value, f"{path}/{key}")]
    if isinstance(doc, (list, tuple)):
        return [p for i, value in enumerate(doc) for p in non_finite_paths(value, f"{path}/{i}")]
    return []


def _validate(doc: Any, file_name: str, what: str) -> None:
    bad = non_finite_paths(doc)
    if bad:
        raise ResultValidationError(
            f"{what} holds non-finite numbers (NaN/Infinity are not JSON) at: {', '.join(bad[:10])}"
        )
    quick = _compiled_check(file_name)
    if quick is not None and quick(doc):
        return  # valid: jsonschema would list no error (fast_check)
    errors = sorted(
        _validator(file_name).iter_errors(doc), key=lambda e: list(map(str, e.absolute_path))
    )
    if errors:
        lines = "\n  ".join(_describe_error(e) for e in errors)
        raise ResultValidationError(f"{what} does not match {file_name}:\n  {lines}")


def validate_result(doc: Any) -> None:
    """Raise :class:`ResultValidationError` unless ``doc`` matches the result schema and its digest."""
    _validate(
        doc,
        RESULT_SCHEMA_FILE,
        f"result {doc.get('case_id', '?')!r}" if isinstance(doc, dict) else "result",
    )
    expected = manifest_digest(doc["manifest"])
    if doc["manifest_digest"] != expected:
        raise ResultValidationError(
            f"result {doc['case_id']!r}: manifest_digest {doc['manifest_digest']} does not match "
            f"the embedded manifest ({expected})"
        )


def validate_manifest(doc: Any) -> None:
    _validate(doc, MANIFEST_SCHEMA_FILE, "manifest")


def atomic_write_bytes(path: str | os.PathLike[str], payload: bytes) -> Path:
    """Write to a temp file in the target directory, fsync, then rename over ``path``.

    Readers (and xdist siblings) see the old file or the new one, never a torn one.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp creates 0600; results are shared artefacts (CI uploads, other users' reports).
        os.fchmod(fd, RESULT_FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, target)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return target


def atomic_write_json(path: str | os.PathLike[str], doc: Any) -> Path:
    """Atomically write ``doc`` as indented, key-sorted JSON (see :func:`atomic_write_bytes`)."""
    payload = json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"
    return atomic_write_bytes(path, payload.encode())


def write_result(path: str | os.PathLike[str], doc: dict[str, Any]) -> Path:
    """Validate ``doc`` then write it atomically; an invalid result writes nothing."""
    validate_result(doc)
    return atomic_write_json(path, doc)


def read_result(path: str | os.PathLike[str]) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    validate_result(doc)
    return doc


def result_path(results_dir: str | os.PathLike[str], case_id: str) -> Path:
    """A file name for ``case_id`` that is safe on every filesystem and unique per id."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", case_id).strip("._")[:MAX_FILE_STEM]
    digest = hashlib.sha256(case_id.encode()).hexdigest()[:CASE_DIGEST_CHARS]
    return Path(results_dir) / f"{stem}-{digest}.json"


def build_result(
    *,
    case_id: str,
    case_kind: str,
    backend: str,
    settings: RunSettings | Mapping[str, Any],
    manifest: Mapping[str, Any],
    workload: Mapping[str, Any],
    protocol: Mapping[str, Any],
    metrics: Mapping[str, Any],
    evidence: Mapping[str, Any],
    labels: Mapping[str, Any] | None = None,
    headline_metric: str = DEFAULT_HEADLINE_METRIC,
    notes: str | None = None,
    created_at: str | None = None,
    host: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble one result document (not yet validated: :func:`write_result` does that).

    ``labels`` defaults to ``synthetic`` = forced-balanced routing and
    ``comparability`` = ``"comparable"``; pass ``{"comparability":
    "exploratory", "comparability_reason": ...}`` when parity is not established.
    ``host`` is :func:`pytest_afd.stats.host.host_json` of the measured repetitions.
    """
    settings_doc = settings_json(settings) if isinstance(settings, RunSettings) else dict(settings)
    routing = settings_doc["expert_balancing"]["routing"]
    label_doc = {"synthetic": routing == "forced_balanced", "comparability": "comparable"}
    label_doc.update(labels or {})
    # The case's own run identity (manifest["run"]) is part of what its digest names.
    manifest_doc = with_run(manifest, settings_doc)
    digest = manifest_doc["digest"]
    doc = {
        "schema_version": SCHEMA_VERSION,
        "kind": "afd-result",
        "case_id": case_id,
        "case_kind": case_kind,
        "backend": backend,
        "created_at": created_at or _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "headline_metric": headline_metric,
        "settings": settings_doc,
        "workload": dict(workload),
        "protocol": dict(protocol),
        "labels": label_doc,
        "metrics": dict(metrics),
        "evidence": dict(evidence),
        "manifest_digest": digest,
        "manifest": manifest_doc,
    }
    if notes is not None:
        doc["notes"] = notes
    if host is not None:
        doc["host"] = dict(host)
    return doc


def headline(doc: Mapping[str, Any]) -> tuple[str, float | None, float | None, str]:
    """(metric name, median, CV, unit) of a result's headline metric for summary tables."""
    name = doc.get("headline_metric", DEFAULT_HEADLINE_METRIC)
    value = doc["metrics"].get(name)
    if isinstance(value, Mapping) and "stats" in value:
        return name, value["stats"]["median"], value["stats"]["cv"], value["unit"]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return name, float(value), None, ""
    return name, None, None, ""


# Where each item of the RFC's "Reproducible benchmark harness and evidence"
# (and its Metrics section) lives in a result document. Every pointer is
# required by the schemas; tests remove each one and expect a validation error.
RFC_FIELD_POINTERS: tuple[tuple[str, str], ...] = (
    ("AFD commit", "/manifest/software/afd_commit"),
    ("vLLM revision", "/manifest/software/vllm_revision"),
    ("vLLM-Ascend revision", "/manifest/software/vllm_ascend_revision"),
    ("container digest", "/manifest/software/container_digest"),
    ("driver", "/manifest/software/driver_version"),
    ("firmware", "/manifest/software/firmware_version"),
    ("CANN", "/manifest/software/cann_version"),
    ("PyTorch", "/manifest/software/torch_version"),
    ("torch-npu", "/manifest/software/torch_npu_version"),
    ("model/checkpoint revision", "/manifest/model/checkpoint_revision"),
    ("tokenizer", "/manifest/model/tokenizer"),
    ("W8A8 configuration", "/manifest/model/quantization"),
    ("layer count", "/manifest/model/num_layers"),
    ("node/device type", "/manifest/hardware/device_type"),
    ("device count", "/manifest/hardware/device_count"),
    ("node count", "/manifest/hardware/node_count"),
    ("network/fabric", "/manifest/hardware/fabric"),
    ("rank mapping", "/manifest/topology/rank_mapping"),
    ("TP/SP/PCP/DP/EP/PP topology", "/manifest/topology/attention"),
    ("FFN topology", "/manifest/topology/ffn"),
    ("Attention:FFN ratio", "/manifest/topology/attention_ffn_ratio"),
    ("scheduler", "/settings/scheduler"),
    ("eager/graph", "/settings/execution_mode"),
    ("async MoE", "/settings/async_moe"),
    ("chunked prefill", "/settings/chunked_prefill"),
    ("prefix cache", "/settings/prefix_cache"),
    ("expert balancing", "/settings/expert_balancing"),
    ("split policy", "/settings/split_policy"),
    ("dataset identity", "/workload/dataset"),
    ("request count", "/workload/request_count"),
    ("arrival process", "/workload/arrival_process"),
    ("prompt lengths", "/workload/prompt_lengths"),
    ("output lengths", "/workload/output_length"),
    ("random seed", "/protocol/seed"),
    ("warmup", "/protocol/warmups"),
    ("repetitions", "/protocol/repetitions"),
    ("run order", "/protocol/run_order"),
    ("requested prefix-cache hit ratio", "/evidence/prefix_cache/requested_hit_ratio"),
    ("realized prefix-cache hit ratio", "/evidence/prefix_cache/realized_hit_ratio"),
    ("scheduled real tokens", "/evidence/tokens/scheduled_real_tokens"),
    ("padded tokens", "/evidence/tokens/padded_tokens"),
    ("per-ubatch token counts", "/evidence/tokens/per_ubatch_real_tokens"),
    ("imbalance", "/evidence/tokens/max_imbalance"),
    ("per-step split evidence", "/evidence/steps"),
    ("per-expert routed tokens", "/evidence/expert_load/per_expert"),
    ("per-rank routed tokens", "/evidence/expert_load/per_rank"),
    ("per-layer timings", "/evidence/per_layer_timings"),
    ("prefill throughput", "/metrics/prefill_tokens_per_s"),
    ("request throughput", "/metrics/request_throughput"),
    ("TTFT p50/p90/p95/p99", "/metrics/ttft_s"),
    ("completed requests", "/metrics/completed_requests"),
    ("failed requests", "/metrics/failed_requests"),
    ("NPU memory", "/metrics/peak_memory_bytes"),
    ("synthetic label", "/labels/synthetic"),
    ("comparable/exploratory label", "/labels/comparability"),
    ("manifest digest", "/manifest_digest"),
)
