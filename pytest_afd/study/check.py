"""Does a run's manifest contradict the frozen study? (docs/study.md, "The check")

:func:`contradictions` compares what a case ran on (its result manifest,
``schemas/manifest.schema.json``) with what the study froze: the stack's
commits and versions, the topology, the model and its layer count, and the
correctness tolerances. Each difference is one :class:`Contradiction` naming
the study field, the study's value and the run's value, so a case on another
vLLM-Ascend commit is refused with the commit it ran on, never silently mixed
into the study's tables.

Rules (why): a study value recorded absent (unknown when frozen) pins nothing
and is not checked; a run value that is absent while the study pins one *is* a
contradiction, because the run cannot show it ran on the pinned stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_afd.core.absent import is_absent
from pytest_afd.golden.compare import PROFILES
from pytest_afd.results.stand_in import SERVED_LATER_PREFIX
from pytest_afd.study.document import StudyError, load_study  # noqa: F401  (re-exported)

# study stack field -> the manifest's /software key that records it on a run.
STACK_SOFTWARE_KEYS = (
    ("vllm", "vllm_revision"),
    ("vllm_ascend", "vllm_ascend_revision"),
    ("afd_plugin", "afd_commit"),
    ("torch_npu", "torch_npu_version"),
    ("cann", "cann_version"),
)
RUN_ABSENT = "<absent: {reason}>"
RUN_MISSING = "<missing from the manifest>"


@dataclass(frozen=True)
class Contradiction:
    """One field where the run is not what the study froze."""

    field: str  # the study's field, e.g. "stack.vllm_ascend"
    study_value: Any
    run_value: Any

    def describe(self) -> str:
        return f"{self.field}: study {self.study_value!r}, run {self.run_value!r}"


def _shown(value: Any) -> Any:
    """A run value as reported: an absent record becomes its reason (never a bare null)."""
    return RUN_ABSENT.format(reason=value["absent_reason"]) if is_absent(value) else value


def _get(doc: Mapping[str, Any], *path: str) -> Any:
    value: Any = doc
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return RUN_MISSING
        value = value[key]
    return value


def _pinned(field: str, study_value: Any, run_value: Any) -> list[Contradiction]:
    """A contradiction when the study pins ``study_value`` and the run has something else."""
    if is_absent(study_value) or study_value == run_value:
        return []
    return [Contradiction(field, study_value, _shown(run_value))]


def tolerance_table(profiles: Mapping[str, Any] = PROFILES) -> dict[str, dict[str, Any]]:
    """The golden comparison's allowances as the study records them (kind, atol, rtol, topk)."""
    return {name: {"kind": p.kind, "atol": float(p.atol), "rtol": float(p.rtol), "topk": int(p.topk)}
            for name, p in sorted(profiles.items())}


def _stack(study: Mapping[str, Any], manifest: Mapping[str, Any]) -> list[Contradiction]:
    found: list[Contradiction] = []
    for field, key in STACK_SOFTWARE_KEYS:
        found += _pinned(f"stack.{field}", study["stack"][field], _get(manifest, "software", key))
    return found


def _model(study: Mapping[str, Any], manifest: Mapping[str, Any]) -> list[Contradiction]:
    """The run's model must be the study's checkpoint, or its reduced-layer variant, at that depth."""
    model = study["stack"]["model"]
    name, layers = _get(manifest, "model", "name"), _get(manifest, "model", "num_layers")
    variants = {model["checkpoint"]: model["layers"]}
    reduced = model.get("reduced")
    if reduced:
        variants[reduced["checkpoint"]] = reduced["layers"]
    if name not in variants:
        return [Contradiction("stack.model.checkpoint", sorted(variants), _shown(name))]
    field = "stack.model.layers" if name == model["checkpoint"] else "stack.model.reduced.layers"
    found = _pinned(field, variants[name], layers)
    found += _pinned("stack.model.revision", model["revision"],
                     _get(manifest, "model", "checkpoint_revision"))
    found += _pinned("stack.model.quantization", model["quantization"],
                     _get(manifest, "model", "quantization"))
    return found


def _topology(study: Mapping[str, Any], manifest: Mapping[str, Any]) -> list[Contradiction]:
    """The study's topology (or its PP reference's, for Stage F) on the frozen nodes."""
    topology = study["topology"]
    allowed = [topology["name"]]
    if study.get("pp_reference"):
        allowed.append(study["pp_reference"]["topology"])
    canonical = _get(manifest, "topology", "canonical")
    if canonical not in allowed:
        shown = allowed[0] if len(allowed) == 1 else allowed
        return [Contradiction("topology.name", shown, _shown(canonical))]
    if canonical != topology["name"]:
        return []  # the PP reference's layout: its own device count (Stage F checks parity)
    return (_pinned("topology.devices_per_node", topology["devices_per_node"],
                    _get(manifest, "hardware", "devices_per_node"))
            + _pinned("topology.nodes", topology["nodes"], _get(manifest, "hardware", "node_count")))


def _tolerances(study: Mapping[str, Any], manifest: Mapping[str, Any]) -> list[Contradiction]:
    """The run's tolerances: the manifest's when it records them, else this harness's profiles."""
    run = manifest.get("tolerances") or tolerance_table()
    found = []
    for name in sorted(set(study["tolerances"]) | set(run)):
        study_value = study["tolerances"].get(name, "<not in the study>")
        found += _pinned(f"tolerances.{name}", study_value, run.get(name, RUN_MISSING))
    return found


SCOPE_ALL = "all"
SCOPE_STACK = "stack"
"""Gates: only the software stack and the tolerances. A gate checks the split path's
correctness on layouts and small models of its own (other topologies, 2-layer
models, no backend at all), so their topology and model are the gate's, not the
study's; a gate on another stack commit or tolerance still certifies nothing here."""


def contradictions(study: Mapping[str, Any], manifest: Mapping[str, Any], *,
                   scope: str = SCOPE_ALL) -> list[Contradiction]:
    """Every field where ``manifest`` (a result's manifest) is not what ``study`` froze.

    ``scope`` :data:`SCOPE_STACK` leaves out the topology and the model (gates).
    """
    if scope not in (SCOPE_ALL, SCOPE_STACK):
        raise ValueError(f"scope={scope!r}; expected {SCOPE_ALL!r} or {SCOPE_STACK!r}")
    found = _stack(study, manifest)
    if scope == SCOPE_ALL:
        found += _topology(study, manifest) + _model(study, manifest)
    return found + _tolerances(study, manifest)


def served_later(contradiction: Contradiction) -> bool:
    """A run value its deployment reports only once it is up (deploy-command mode, checkpoint
    not readable here): not known before the case measures, so checked on its result."""
    run = contradiction.run_value
    return isinstance(run, str) and run.startswith(RUN_ABSENT.split("{")[0] + SERVED_LATER_PREFIX)


def contradiction_message(study: Mapping[str, Any], found: list[Contradiction]) -> str:
    """One line per contradicting field, headed by the study's name and digest."""
    lines = [f"the run contradicts the frozen study {study['name']!r} ({study['digest']}) "
             f"in {len(found)} field(s):"]
    lines += [f"  {c.describe()}" for c in found]
    return "\n".join(lines)
