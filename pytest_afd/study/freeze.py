"""``study freeze``: the RFC's step 1 freeze list as one study document (docs/study.md).

Sources, in order of precedence: an explicit flag, then ``--from-manifest`` (a
result or manifest JSON of a run on the stack being frozen), then
``--from-study`` (the study this one is derived from). A stack field none of
them gives is recorded absent with the reason, never guessed. Launch commands
come from ``afd-launch-plan --json`` files (``--launch-plan``), one shell line
per role.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_afd.core.absent import absent
from pytest_afd.stats.repetitions import RUN_ORDERS
from pytest_afd.study.check import STACK_SOFTWARE_KEYS, tolerance_table
from pytest_afd.study.document import (
    STUDY_KIND,
    STUDY_SCHEMA_VERSION,
    StudyError,
    descent,
    load_study,
    seal,
    utc_now,
)
from pytest_afd.topology.spec import TopologyError, parse_topology
from pytest_afd.workloads.scale import DEFAULT_STAGE_SCALES, FULL_SCALE

CHUNK_SEMANTICS = ("per_dp_replica", "global")
CHUNK_NOTES = {
    "per_dp_replica": "the chunk-size flag is each DP replica's token budget: the suites schedule "
                      "per replica (suites/stage_d/stage_d_chunks.py, CHUNK_DP_FOLDING = 1)",
    "global": "the chunk-size flag is one budget for all DP replicas: the stack divides it by DP "
              "before scheduling, so each replica's chunk is flag // dp",
}
DEFAULT_CACHE_HIT_GENERATOR = (
    "pytest_afd.workloads hit-ratio twins: the same logical prompts as the hit-0 twin with a "
    "shared prefix of requested_hit_ratio x tokens, seeded in the steady phase (docs/workloads.md)"
)
DEFAULT_CACHE_HIT_VERIFICATION = (
    "realized hit ratio = runtime per-request cached tokens / logical prompt tokens "
    "(evidence.prefix_cache.realized_hit_ratio); never inferred from the input construction"
)
# What the Attention part's dims say TP/SP means on this stack (first one present wins).
TERMINOLOGY_DIMS = ("pcp", "tp", "sp", "cp", "dcp")
TERMINOLOGY_CHOICES = (*TERMINOLOGY_DIMS, "none")
DEFAULT_PROTOCOL = {"warmups": 1, "repetitions": 3, "run_order": "interleaved", "seed": 0,
                    "routing": "natural"}
STACK_FLAGS = {"vllm": "--vllm", "vllm_ascend": "--vllm-ascend", "afd_plugin": "--afd-plugin",
               "torch_npu": "--torch-npu", "cann": "--cann"}
RESULT_KIND = "afd-result"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", required=True, help="the study's name")
    parser.add_argument("--output", required=True, help="where to write the study JSON")
    parser.add_argument("--from-manifest", default=None, metavar="FILE",
                        help="a result JSON (its manifest) or a manifest JSON of a run on the "
                             "stack being frozen: stack, model, topology and protocol from it")
    parser.add_argument("--from-study", default=None, metavar="FILE",
                        help="derive from this study (parent_digest set; flags override)")
    parser.add_argument("--npu-topology", default=None, help="topology, e.g. dp3pcp8-ep8")
    parser.add_argument("--devices-per-node", type=int, default=None,
                        help="NPUs per physical node (the topology's nodes follow from it)")
    parser.add_argument("--nodes", type=int, default=None, help="physical nodes the study uses")
    parser.add_argument("--tp-sp-maps-to", choices=TERMINOLOGY_CHOICES, default=None,
                        help="what the RFC's TP/SP means on this stack (default: from the "
                             "Attention part's dims, pcp first)")
    parser.add_argument("--terminology-note", default=None,
                        help="free text: how the RFC's TP/SP terms map onto this stack")
    parser.add_argument("--launch-plan", action="append", default=[], metavar="FILE",
                        help="'afd-launch-plan --json' output (repeat: AFD and baseline)")
    parser.add_argument("--chunk-semantics", choices=CHUNK_SEMANTICS, default=None,
                        help="whether the chunk-size flag counts per DP replica or globally")
    parser.add_argument("--chunk-note", default=None,
                        help="free text on the chunk-size flag (docs/chunk-planner.md)")
    parser.add_argument("--cache-hit-generator", default=None,
                        help="the generator that sets the prefix-hit ratio (Stage B)")
    parser.add_argument("--cache-hit-verification", default=None,
                        help="how the realized hit ratio is read back at run time")
    parser.add_argument("--pp-reference", default=None, metavar="TOPOLOGY",
                        help="the PP / dynamic CPP reference layout (Stage F), e.g. pp4pcp8")
    parser.add_argument("--pp-terminology", default=None,
                        help="the stack's name and flags for that layout")
    parser.add_argument("--pp-note", default=None,
                        help="free text on the PP / dynamic CPP reference (Stage F)")
    for field, flag in STACK_FLAGS.items():
        parser.add_argument(flag, default=None, dest=f"stack_{field}",
                            help=f"pinned {field} commit or version")
    parser.add_argument("--checkpoint", default=None, help="the full model's checkpoint")
    parser.add_argument("--revision", default=None, help="the checkpoint's revision")
    parser.add_argument("--quantization", default=None,
                        help="the checkpoint's quantization, e.g. w8a8")
    parser.add_argument("--layers", type=int, default=None, help="the full model's layer count")
    parser.add_argument("--reduced-checkpoint", default=None,
                        help="the reduced-layer variant's checkpoint (the diagnostic stages)")
    parser.add_argument("--reduced-layers", type=int, default=None,
                        help="the reduced model's layer count (the recipe's first ten)")
    parser.add_argument("--warmups", type=int, default=None,
                        help="warm-up runs per case the protocol discards")
    parser.add_argument("--repetitions", type=int, default=None,
                        help="measured repetitions per case (fixed protocol)")
    parser.add_argument("--run-order", choices=RUN_ORDERS, default=None,
                        help="the order cases and repetitions run in")
    parser.add_argument("--seed", type=int, default=None,
                        help="the workloads' random seed")
    parser.add_argument("--routing", choices=("natural", "forced_balanced"), default=None,
                        help="expert routing of the headline runs")
    parser.add_argument("--stage-scale", type=float, default=None,
                        help="the stage scale the study runs at (default: the manifest "
                             "backend's default, else 1)")


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest inside a result JSON, or a manifest JSON itself; StudyError naming the file."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise StudyError(f"--from-manifest {path}: cannot be read as JSON ({exc})") from exc
    manifest = doc.get("manifest") if doc.get("kind") == RESULT_KIND else doc
    if not isinstance(manifest, dict) or manifest.get("kind") != "afd-manifest":
        raise StudyError(f"--from-manifest {path}: neither a result (kind {RESULT_KIND!r}) nor a "
                         f"manifest (kind 'afd-manifest'); kind is {doc.get('kind')!r}")
    return manifest


def launch_commands(paths: list[str]) -> dict[str, str] | dict[str, Any]:
    """role (``role.nodeN`` when a role spans nodes) -> the plan's shell line for it."""
    if not paths:
        return absent("no launch plan was frozen (--launch-plan FILE from afd-launch-plan --json)")
    commands: dict[str, str] = {}
    for path in paths:
        try:
            plan = json.loads(Path(path).read_text(encoding="utf-8"))
            processes = plan["processes"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
            raise StudyError(f"--launch-plan {path}: not an afd-launch-plan --json file ({exc})"
                             ) from exc
        roles = [process["role"] for process in processes]
        for process in processes:
            role = process["role"]
            key = role if roles.count(role) == 1 else f"{role}.node{process['node']}"
            if key in commands:
                raise StudyError(f"--launch-plan {path}: role {key!r} is already in another plan")
            commands[key] = process["command_line"]
    return commands


def _first(*values: Any) -> Any:
    return next((value for value in values if value is not None), None)


def _stack(args: argparse.Namespace, manifest: Mapping[str, Any] | None,
           parent: Mapping[str, Any] | None) -> dict[str, Any]:
    software = (manifest or {}).get("software", {})
    model = (manifest or {}).get("model", {})
    if args.checkpoint is not None and model.get("name") != args.checkpoint:
        model = {}  # the manifest ran another model (the reduced one): none of its model facts
    before = (parent or {}).get("stack", {})
    stack: dict[str, Any] = {}
    for field, key in STACK_SOFTWARE_KEYS:
        stack[field] = _first(getattr(args, f"stack_{field}"), software.get(key),
                              before.get(field)) or absent(
            f"not given ({STACK_FLAGS[field]}) and no --from-manifest/--from-study records it")
    old = before.get("model", {})
    checkpoint = _first(args.checkpoint, model.get("name"), old.get("checkpoint"))
    if checkpoint is None:
        raise StudyError("the study needs the model: --checkpoint (or --from-manifest)")
    reduced_checkpoint = _first(args.reduced_checkpoint, (old.get("reduced") or {}).get(
        "checkpoint"))
    reduced_layers = _first(args.reduced_layers, (old.get("reduced") or {}).get("layers"))
    if (reduced_checkpoint is None) != (reduced_layers is None):
        raise StudyError("--reduced-checkpoint and --reduced-layers go together")
    stack["model"] = {
        "checkpoint": checkpoint,
        "revision": _first(args.revision, model.get("checkpoint_revision"), old.get("revision"))
        or absent("not given (--revision) and no manifest records it"),
        "quantization": _first(args.quantization, model.get("quantization"),
                               old.get("quantization"))
        or absent("not given (--quantization) and no manifest records it"),
        "layers": _first(args.layers, model.get("num_layers"), old.get("layers"))
        or absent("not given (--layers) and no manifest records it"),
        "reduced": None if reduced_checkpoint is None
        else {"checkpoint": reduced_checkpoint, "layers": reduced_layers},
    }
    return stack


def _topology(args: argparse.Namespace, manifest: Mapping[str, Any] | None,
              parent: Mapping[str, Any] | None) -> dict[str, Any]:
    before = (parent or {}).get("topology", {})
    hardware = (manifest or {}).get("hardware", {})
    spec = _first(args.npu_topology, (manifest or {}).get("topology", {}).get("canonical"),
                  before.get("name"))
    if spec is None:
        raise StudyError("the study needs the topology: --npu-topology (or --from-manifest)")
    try:
        topology = parse_topology(spec)
    except TopologyError as exc:
        raise StudyError(f"--npu-topology {spec!r}: {exc}") from exc
    per_node = _first(args.devices_per_node, hardware.get("devices_per_node"),
                      before.get("devices_per_node"))
    if per_node is None:
        raise StudyError("the study needs the nodes' device count: --devices-per-node "
                         "(or --from-manifest)")
    dims = topology.attention.dims
    maps_to = _first(args.tp_sp_maps_to, before.get("terminology", {}).get("tp_sp_maps_to"),
                     next((dim for dim in TERMINOLOGY_DIMS if dim in dims), "none"))
    note = _first(args.terminology_note, before.get("terminology", {}).get("note"),
                  f"the RFC's TP/SP prefill is {maps_to!r} on this stack's Attention part "
                  f"{topology.attention.spec}")
    return {
        "name": topology.canonical,
        "attention": topology.attention.spec,
        "ffn": None if topology.ffn is None else topology.ffn.spec,
        "devices_per_node": per_node,
        "nodes": _first(args.nodes, hardware.get("node_count"), before.get("nodes"),
                        topology.nodes_needed(per_node)),
        "terminology": {"tp_sp_maps_to": maps_to, "note": note},
    }


def _protocol(args: argparse.Namespace, manifest: Mapping[str, Any] | None,
              parent: Mapping[str, Any] | None) -> dict[str, Any]:
    recorded = (manifest or {}).get("protocol", {})
    before = (parent or {}).get("protocol", {})
    protocol = {key: _first(getattr(args, key), recorded.get(key), before.get(key), default)
                for key, default in DEFAULT_PROTOCOL.items()}
    backend = (manifest or {}).get("backend", {}).get("name")
    protocol["stage_scale"] = _first(args.stage_scale, before.get("stage_scale"),
                                     DEFAULT_STAGE_SCALES.get(backend, FULL_SCALE))
    return protocol


def _pp_reference(args: argparse.Namespace, parent: Mapping[str, Any] | None) -> Any:
    if args.pp_reference is None:
        return (parent or {}).get("pp_reference")
    try:
        canonical = parse_topology(args.pp_reference).canonical
    except TopologyError as exc:
        raise StudyError(f"--pp-reference {args.pp_reference!r}: {exc}") from exc
    return {"topology": canonical,
            "terminology": args.pp_terminology or "not given (--pp-terminology)",
            "note": args.pp_note or "the resource-matched PP / dynamic CPP layout of Stage F"}


def build_study(args: argparse.Namespace) -> dict[str, Any]:
    """The sealed study the flags describe (StudyError naming the flag or file when it cannot)."""
    manifest = None if args.from_manifest is None else read_manifest(args.from_manifest)
    parent = None if args.from_study is None else load_study(args.from_study)
    chunk = _first(args.chunk_semantics, (parent or {}).get("chunk_semantics", {}).get("value"),
                   "per_dp_replica")
    cache_before = (parent or {}).get("cache_hit", {})
    launch = (launch_commands(args.launch_plan) if args.launch_plan or parent is None
              else parent["launch_commands"])
    doc = {
        "kind": STUDY_KIND,
        "schema_version": STUDY_SCHEMA_VERSION,
        "name": args.name,
        "frozen_at": utc_now(),
        "parent_digest": None,
        "topology": _topology(args, manifest, parent),
        "launch_commands": launch,
        "chunk_semantics": {"value": chunk, "note": args.chunk_note or CHUNK_NOTES[chunk]},
        "cache_hit": {
            "generator": _first(args.cache_hit_generator, cache_before.get("generator"),
                                DEFAULT_CACHE_HIT_GENERATOR),
            "verification": _first(args.cache_hit_verification,
                                   cache_before.get("verification"),
                                   DEFAULT_CACHE_HIT_VERIFICATION),
        },
        "pp_reference": _pp_reference(args, parent),
        "stack": _stack(args, manifest, parent),
        "tolerances": tolerance_table(),
        "protocol": _protocol(args, manifest, parent),
        "references": None if parent is None else parent["references"],
    }
    if parent is not None:
        doc.update(descent(parent))
    return seal(doc)
