"""Assemble the run manifest (``schemas/manifest.schema.json``) automatically.

The host's software versions are probed by :mod:`pytest_afd.results.host_probe`; the
topology, model and hardware facts come from the backend's description (a
deployment's plan and what its server reports) and the options. Whatever cannot
be found is recorded as ``{"value": null, "absent_reason": ...}`` saying why.

The digest (:func:`manifest_digest`) covers the whole manifest except the
``digest`` field and carries no timestamp, so it names the stack + topology +
protocol: cases with the same digest ran on the same immutable setup.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pytest_afd.core.absent import absent
from pytest_afd.results.host_probe import collect_software
from pytest_afd.topology.spec import DEFAULT_DEVICES_PER_NODE, Topology

MANIFEST_SCHEMA_VERSION = "1.0.0"
DIGEST_PREFIX = "sha256:"


def canonical_json(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``manifest`` without its ``digest`` field."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return DIGEST_PREFIX + hashlib.sha256(canonical_json(body).encode()).hexdigest()


MISSING_FIELD = "<missing>"
"""What :func:`manifest_differences` reports for a field one side lacks."""


def manifest_differences(recorded: Any, current: Any, path: str = ""
                         ) -> list[tuple[str, Any, Any]]:
    """``(JSON pointer, recorded, current)`` for every leaf that differs, in key order.

    Why leaves: "the manifests differ" (two digests) does not say whether a
    golden was recorded on another model, topology or just another commit.
    """
    if isinstance(recorded, Mapping) and isinstance(current, Mapping):
        differences: list[tuple[str, Any, Any]] = []
        for key in sorted(set(recorded) | set(current), key=str):
            pointer = f"{path}/{key}"
            if key not in recorded or key not in current:
                differences.append((pointer, recorded.get(key, MISSING_FIELD),
                                    current.get(key, MISSING_FIELD)))
            else:
                differences.extend(manifest_differences(recorded[key], current[key], pointer))
        return differences
    return [] if recorded == current else [(path or "/", recorded, current)]


def _reported(description: Mapping[str, Any], section: str, key: str, what: str) -> Any:
    value = description.get(section, {}).get(key) if section else description.get(key)
    return absent(f"the backend did not report the {what}") if value is None else value


def collect_manifest(
    *,
    topology: Topology,
    backend_name: str,
    backend_description: Mapping[str, Any] | None,
    backend_absent_reason: str | None = None,
    model_name: str,
    protocol: Mapping[str, Any],
    emulated: bool,
    devices_per_node: int = DEFAULT_DEVICES_PER_NODE,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Build a manifest document (with ``digest``) for one session.

    ``backend_description`` is ``Backend.describe()``; its optional keys
    ``model`` (``checkpoint_revision``, ``tokenizer``, ``quantization``,
    ``num_layers``), ``device_type``, ``fabric`` and ``software`` (extra or
    overriding version strings) fill the matching manifest fields.
    """
    description = dict(backend_description or {})
    # A deployment that says it is the harness's own CPU server (attach mode) is emulated.
    emulated = emulated or bool(description.get("emulated"))
    software = collect_software(environ)
    software.update(description.get("software", {}))
    topo = topology.to_json(devices_per_node)
    topo["ffn"] = (
        topo["ffn"]
        if topo["ffn"] is not None
        else absent("non-AFD topology: FFN is co-located with Attention")
    )
    if topo["attention_ffn_ratio"] is None:
        topo["attention_ffn_ratio"] = absent("non-AFD topology: Attention and FFN share devices")
    topo["cpu_emulation"] = (
        topology.cpu_emulation().to_json()
        if emulated
        else absent("runs on real devices, not emulated")
    )
    default_device = "cpu (emulated Ascend NPU topology)" if emulated else None
    manifest = {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "kind": "afd-manifest",
        "software": software,
        "model": {
            "name": model_name,
            "checkpoint_revision": _reported(
                description, "model", "checkpoint_revision", "checkpoint revision"
            ),
            "tokenizer": _reported(description, "model", "tokenizer", "tokenizer"),
            "quantization": _reported(description, "model", "quantization", "quantization config"),
            "num_layers": _reported(description, "model", "num_layers", "layer count"),
            "execution_mode": _reported(description, "model", "execution_mode", "execution mode"),
        },
        "hardware": {
            "device_type": description.get("device_type", default_device)
            or absent("the backend did not report the device type"),
            "device_count": topology.devices_needed,
            # The deployment's plan (or launch) says how many; else the option's value.
            "node_count": description.get("node_count", topology.nodes_needed(
                description.get("devices_per_node", devices_per_node))),
            "devices_per_node": description.get("devices_per_node", devices_per_node),
            "devices_per_node_source": "deployment" if "devices_per_node" in description
            else "--afd-devices-per-node",
            "fabric": description.get("fabric")
            or absent(
                "emulated on CPU: no NPU fabric"
                if emulated
                else "the backend did not report the fabric"
            ),
            "emulated": emulated,
        },
        "topology": topo,
        "protocol": dict(protocol),
        "backend": {
            "name": backend_name,
            "description": description
            if backend_description is not None
            else absent(backend_absent_reason or "no backend was started in this session"),
        },
    }
    manifest["digest"] = manifest_digest(manifest)
    return manifest


# ---- what one case really ran: manifest["run"] ------------------------------------
RUN_SECTION = "run"
"""The manifest key holding the case's run identity (the report groups stacks by it)."""
RUN_KEYS = (
    "topology", "model", "num_layers", "model_overrides", "backend", "backend_mode",
    "attention_ranks", "ffn_ranks", "threads", "routing", "quantization", "block_size",
)  # fmt: skip
MODE_IN_PROCESS = "in_process"
MODE_AFD_PROCESSES = "afd_processes"
MODE_NO_BACKEND = "no_backend"
HTTP_MODE_PREFIX = "http_"
MODEL_OVERRIDE_SEPARATOR = ":"


def model_overrides(model_name: str) -> dict[str, str]:
    """``field=value`` overrides after the colon of a model name (``reduced:num_hidden_layers=2``)."""
    _, _, text = model_name.partition(MODEL_OVERRIDE_SEPARATOR)
    pairs = (item.partition("=") for item in filter(None, text.split(",")))
    return {key.strip(): value.strip() for key, _, value in pairs}


def _setting(settings: Mapping[str, Any], *path: str, default: Any = None) -> Any:
    value: Any = settings
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    return value


def _backend_mode(description: Mapping[str, Any] | None, afd_processes: bool,
                  emulation: Mapping[str, Any] | None) -> tuple[str, Any, Any]:
    """(mode, attention ranks, FFN ranks) of the process layout the case ran on."""
    if description is None:
        ranks = absent("no backend ran for this case")
        return MODE_NO_BACKEND, ranks, ranks
    if description.get("transport") == "http":
        mode = description.get("mode")
        ranks = absent("an HTTP deployment's rank layout is its server's, not reported here")
        return HTTP_MODE_PREFIX + (mode or "attach"), ranks, ranks
    if afd_processes:
        ffn = max(1, int(emulation["ffn_processes"])) if emulation else 1
        return MODE_AFD_PROCESSES, 1, ffn
    return MODE_IN_PROCESS, 1, 0


def run_identity(manifest: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The case's identity from its manifest (topology, model, backend) and its settings doc.

    ``settings`` is the result's ``settings`` object (``results.settings_json``).
    ``ffn_ranks`` 0 means the FFN runs in the Attention process.
    """
    backend = manifest.get("backend", {})
    described = backend.get("description")
    description = described if isinstance(described, Mapping) and "absent_reason" not in (
        described
    ) else None
    topology = manifest.get("topology", {})
    emulation = topology.get("cpu_emulation")
    emulation = emulation if isinstance(emulation, Mapping) and "ffn_processes" in emulation else None
    mode, attention_ranks, ffn_ranks = _backend_mode(
        description, bool(settings.get("afd_processes", False)), emulation
    )
    threads = None if description is None else description.get("torch_threads")
    model = manifest.get("model", {})
    return {
        "topology": topology.get("canonical", absent("the manifest has no topology")),
        "model": model.get("name", absent("the manifest has no model")),
        "num_layers": model.get("num_layers", absent("the manifest has no layer count")),
        "model_overrides": model_overrides(str(model.get("name", ""))),
        "backend": backend.get("name", absent("the manifest has no backend")),
        "backend_mode": mode,
        "attention_ranks": attention_ranks,
        "ffn_ranks": ffn_ranks,
        "threads": absent("the backend did not report its thread count")
        if threads is None else threads,
        "routing": _setting(settings, "expert_balancing", "routing"),
        "quantization": settings.get("quantization"),
        "block_size": _setting(settings, "scheduler", "block_size"),
    }


def with_run(manifest: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``manifest`` with ``run`` = :func:`run_identity` and the digest recomputed."""
    doc = {key: value for key, value in manifest.items() if key != "digest"}
    doc[RUN_SECTION] = run_identity(manifest, settings)
    doc["digest"] = manifest_digest(doc)
    return doc


# Run fields a case chooses within one stack (the report's condition columns), and
# the rest, which name the stack itself (what the report groups and labels by).
CASE_RUN_KEYS = ("routing", "quantization", "block_size")
STACK_RUN_KEYS = tuple(key for key in RUN_KEYS if key not in CASE_RUN_KEYS)


def stack_digest(manifest: Mapping[str, Any]) -> str:
    """``sha256:`` of the manifest without its digest and without the run's per-case keys.

    Two results with the same stack digest ran on the same software, hardware,
    topology, model (and layers/overrides), backend mode, rank counts and
    threads; their ``manifest_digest`` still differs when routing, quantization
    or block size does.
    """
    body = {key: value for key, value in manifest.items() if key != "digest"}
    run = body.get(RUN_SECTION)
    if isinstance(run, Mapping):
        body[RUN_SECTION] = {key: run[key] for key in STACK_RUN_KEYS if key in run}
    return manifest_digest(body)
