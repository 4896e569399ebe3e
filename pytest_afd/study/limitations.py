"""A published study's limitations, derived from the evidence it holds, never typed by hand.

Each limitation is computed from the result documents (their manifests,
settings, protocol, sessions, outcomes) and from the cases excluded for
contradicting the frozen study, and names the cases it concerns. The RFC's
rule "the full-layer natural-routing evidence is required before this RFC
makes a production performance recommendation" is :func:`production_gaps`:
a case is production evidence only with every layer of the model, natural
routing, on real devices (not emulated, not the CPU stand-in) and without
instrumentation. Without such evidence the bundle's first line refuses a
production recommendation (:func:`headline_line`) and every region is
labelled diagnostic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_afd.results.documents import is_absent
from pytest_afd.stats.repetitions import MIN_REPETITIONS

FULL_MODEL_LAYERS = 61
"""DeepSeek V3.x's ``num_hidden_layers`` (the CPU backend's ``full`` config has the same)."""
FORCED_ROUTING = "forced_balanced"
EXPECTED_STAGES = ("gate", "stage_a", "stage_b", "stage_c", "stage_d", "stage_e", "stage_f")
"""The RFC's sequence: correctness gates, then Stages A-F."""
PASSED = "passed"
GATE_KIND = "gate"
SHOWN_CASES = 5

REDUCED_LAYERS = "reduced_layers"
FORCED = "forced_routing"
EMULATED = "emulated"
SINGLE_SESSION = "single_session"
FEW_REPETITIONS = "too_few_repetitions"
PROFILED = "profiled_run"
MISSING_STAGE = "missing_stage"
EXCLUDED = "excluded_contradicting_study"
NOT_PASSED = "not_passed"
NO_PAIRS = "no_policy_pairs"


@dataclass(frozen=True)
class Contradicted:
    """One field of a result's manifest that contradicts the frozen study."""

    field: str
    study_value: Any
    run_value: Any


@dataclass(frozen=True)
class Exclusion:
    """A result left out of the publication, with every contradicting field."""

    case_id: str
    source: str
    fields: tuple[Contradicted, ...]

    def text(self) -> str:
        named = "; ".join(f"{c.field}: study {c.study_value!r}, run {c.run_value!r}"
                          for c in self.fields)
        return f"{self.case_id} ({self.source}): {named}"


@dataclass(frozen=True)
class Limitation:
    kind: str
    text: str
    cases: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "cases": list(self.cases)}


def _run(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    return doc["manifest"].get("run", {})


def layer_count(doc: Mapping[str, Any]) -> int | None:
    layers = _run(doc).get("num_layers", doc["manifest"]["model"].get("num_layers"))
    return None if layers is None or is_absent(layers) else int(layers)


def is_emulated(doc: Mapping[str, Any]) -> bool:
    """Emulated topology or the harness's CPU server standing in (manifest.hardware.emulated)."""
    return bool(doc["manifest"]["hardware"].get("emulated")) or doc.get("backend") == "cpu"


def is_instrumented(doc: Mapping[str, Any]) -> bool:
    """The headline repetitions themselves ran under the profiler (``settings.instrumented``).

    A stage case that only *adds* one instrumented run (``evidence.profile``)
    keeps uninstrumented headline figures and is not this.
    """
    return bool(doc["settings"].get("instrumented"))


def has_profile(doc: Mapping[str, Any]) -> bool:
    profile = doc["evidence"].get("profile")
    return profile is not None and not is_absent(profile)


def routing(doc: Mapping[str, Any]) -> str:
    return doc["settings"]["expert_balancing"]["routing"]


def repetitions(doc: Mapping[str, Any]) -> int:
    value = doc["metrics"]["prefill_tokens_per_s"]
    return 0 if is_absent(value) else len(value["repetitions"])


def production_gaps(doc: Mapping[str, Any]) -> list[str]:
    """Why this case is not production evidence (empty: it is)."""
    gaps = []
    layers = layer_count(doc)
    if layers is None or layers < FULL_MODEL_LAYERS:
        gaps.append(f"{'unknown' if layers is None else layers} of {FULL_MODEL_LAYERS} layers")
    if routing(doc) == FORCED_ROUTING:
        gaps.append("forced routing")
    if is_emulated(doc):
        gaps.append("emulated on CPU")
    if is_instrumented(doc):
        gaps.append("instrumented")
    return gaps


def _cases(docs: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    return tuple(sorted({doc["case_id"] for doc in docs}))


def _named(cases: Sequence[str]) -> str:
    shown = ", ".join(cases[:SHOWN_CASES])
    return shown + (f" and {len(cases) - SHOWN_CASES} more" if len(cases) > SHOWN_CASES else "")


def _share(part: Sequence[Any], whole: Sequence[Any]) -> str:
    return f"all {len(whole)}" if len(part) == len(whole) else f"{len(part)} of {len(whole)}"


def required_repetitions(study: Mapping[str, Any]) -> int:
    """The frozen protocol's repetitions, or the RFC's minimum of three."""
    protocol = study.get("protocol")
    wanted = protocol.get("repetitions") if isinstance(protocol, Mapping) else None
    return wanted if isinstance(wanted, int) and wanted > 0 else MIN_REPETITIONS


STAND_IN_DEVICE = "standing in"
"""In ``manifest.hardware.device_type`` of a case the harness's own server served in place of
a deployment (pytest_afd.results.stand_in): attached, or started by a deploy command."""


def _how_emulated(emulated: Sequence[Mapping[str, Any]]) -> str:
    """Which CPU path each emulated case took: the CPU backend, or the CPU server standing in
    for a deployment (and of those, how many a deploy command started)."""
    stand_ins = [d for d in emulated if STAND_IN_DEVICE in str(d["manifest"]["hardware"]
                                                                  .get("device_type"))]
    deployed = [d for d in stand_ins
                if d["manifest"]["backend"].get("description", {}).get("mode") == "deploy"]
    parts = []
    if len(emulated) > len(stand_ins):
        parts.append(f"{len(emulated) - len(stand_ins)} on the CPU backend")
    if stand_ins:
        parts.append(f"{len(stand_ins)} on the pytest-afd CPU server standing in for the "
                     f"deployment, {len(deployed)} of them started by the deploy command")
    return "; ".join(parts)


def _evidence_limitations(docs: Sequence[Mapping[str, Any]], study: Mapping[str, Any]
                          ) -> list[Limitation]:
    found = []
    reduced = [d for d in docs if (layer_count(d) or 0) < FULL_MODEL_LAYERS]
    if reduced:
        counts = sorted({str(layer_count(d) or "unknown") for d in reduced})
        found.append(Limitation(REDUCED_LAYERS, f"reduced layers only: {_share(reduced, docs)} measured cases "
                                f"ran {'/'.join(counts)} of the model's {FULL_MODEL_LAYERS} layers",
                                _cases(reduced)))
    forced = [d for d in docs if routing(d) == FORCED_ROUTING]
    if forced:
        found.append(Limitation(FORCED, f"forced routing: {_share(forced, docs)} cases ran "
                                "forced-balanced expert routing (performance-only, not the "
                                "model's natural routing)", _cases(forced)))
    emulated = [d for d in docs if is_emulated(d)]
    if emulated:
        found.append(Limitation(EMULATED, f"emulated or CPU stand-in: {_share(emulated, docs)} "
                                f"cases ran on CPU, not on Ascend NPUs ({_how_emulated(emulated)})",
                                _cases(emulated)))
    sessions = sorted({str(d.get("session_id", "legacy")) for d in docs})
    if len(sessions) <= 1:
        found.append(Limitation(SINGLE_SESSION, "a single session: between-session noise is not "
                                f"measured (session {sessions[0] if sessions else 'none'})"))
    wanted = required_repetitions(study)
    few = [d for d in docs if repetitions(d) < wanted]
    if few:
        found.append(Limitation(FEW_REPETITIONS, f"too few repetitions: {len(few)} cases have fewer "
                                f"than {wanted} measured repetitions: {_named(_cases(few))}",
                                _cases(few)))
    return found


def derive_limitations(
    docs: Sequence[Mapping[str, Any]],
    study: Mapping[str, Any],
    *,
    exclusions: Sequence[Exclusion] = (),
    pairs: int,
) -> list[Limitation]:
    """Every limitation the evidence shows; ``pairs``: tested token_balanced/request_boundary points.

    The measured cases' limits (layers, routing, emulation, sessions, repetitions,
    instrumentation) are over the performance cases; a missing stage and a case
    that did not pass (a failed gate too) over every case.
    """
    measured = performance_cases(docs)
    found = _evidence_limitations(measured, study)
    profiled = [d for d in measured if is_instrumented(d)]
    if profiled:
        found.append(Limitation(PROFILED, f"a profiled run: {len(profiled)} cases measured under the "
                                "profiler are "
                                "left out of the headline tables and regions (profiler overhead): "
                                f"{_named(_cases(profiled))}", _cases(profiled)))
    present = {d["case_kind"] for d in docs}
    missing = [stage for stage in EXPECTED_STAGES if stage not in present]
    if missing:
        found.append(Limitation(MISSING_STAGE, f"a missing stage: no results of {', '.join(missing)}"))
    failing = [d for d in docs if d.get("outcome", {}).get("status", PASSED) != PASSED]
    if failing:
        found.append(Limitation(NOT_PASSED, f"{len(failing)} cases did not pass and are left out "
                                f"of the regions: {_named(_cases(failing))}", _cases(failing)))
    for exclusion in exclusions:
        found.append(Limitation(EXCLUDED, "excluded for contradicting the frozen study: "
                                + exclusion.text(), (exclusion.case_id,)))
    if pairs == 0:
        found.append(Limitation(NO_PAIRS, "no condition measured both token_balanced and "
                                "request_boundary without instrumentation: no region can be stated"))
    return found


def performance_cases(docs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The measured cases (not gates): what the regions' evidence and its limits are about.

    A gate checks correctness on small models and layouts of its own, with no
    throughput repetitions; counting it would say "2 of 61 layers" or "too few
    repetitions" of a case that never measured performance.
    """
    return [d for d in docs if d["case_kind"] != GATE_KIND]


def headline_line(docs: Sequence[Mapping[str, Any]], production_regions: int) -> str:
    """The bundle's first line: whether it makes a production recommendation, and why not."""
    if production_regions:
        return (f"Production recommendation: {production_regions} region(s) rest on full-layer "
                "natural-routing evidence measured on Ascend NPUs without instrumentation.")
    docs = performance_cases(docs)
    gaps: dict[str, int] = {}
    for doc in docs:
        for gap in production_gaps(doc):
            key = "reduced layers" if gap.endswith(f"of {FULL_MODEL_LAYERS} layers") else gap
            gaps[key] = gaps.get(key, 0) + 1
    why = "; ".join(f"{key} in {count} of {len(docs)} cases" for key, count in gaps.items())
    if not docs:
        why = "no performance case was included"
    elif not gaps:
        why = "no region decided a policy on full-layer natural-routing evidence"
    return ("This bundle makes no production recommendation: the RFC requires full-layer "
            f"natural-routing evidence on NPUs and this study has none ({why}). "
            "Its regions are diagnostic.")
