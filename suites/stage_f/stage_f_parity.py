"""Stage F: the parity check that labels an AFD-vs-PP comparison comparable or exploratory.

The RFC allows a winner/loser claim only with the same total device count and
hardware, the same model and checkpoint, natural routing, the same workload,
prefix-cache state, chunk policy, warmup and repetitions, a validated PP
configuration and matching outputs; anything else is exploratory, with every
failed condition named.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pytest_afd.topology.spec import Topology

COMPARABLE = "comparable"
EXPLORATORY = "exploratory"
NATURAL_ROUTING = "natural"
# (field, what must match) checked in this order.
PARITY_FIELDS = (
    ("device_count", "total device count"),
    ("device_type", "device type / hardware generation"),
    ("model", "model and checkpoint"),
    ("routing", "expert routing"),
    ("workload_digest", "workload (dataset content hash)"),
    ("prefix_caching", "prefix caching"),
    ("cache_phase", "prefix-cache state"),
    ("chunk_size", "chunk policy"),
    ("warmups", "warmup runs"),
    ("repetitions", "measured repetitions"),
    ("run_order", "run order"),
)
MODEL_IDENTITY_KEYS = ("name", "num_layers", "checkpoint_revision", "quantization")


@dataclass(frozen=True)
class ParityFacts:
    """What one side of the comparison ran, read from its result document."""

    layout: str
    device_count: int
    device_type: str
    model: tuple[tuple[str, str], ...]
    routing: str
    workload_digest: str
    prefix_caching: bool
    cache_phase: str
    chunk_size: int | None
    warmups: int
    repetitions: int
    run_order: str
    # The layout is a validated configuration of this backend (else why not).
    validated: bool
    validation_note: str
    next_tokens: tuple[tuple[str, int], ...]

    @classmethod
    def from_result(
        cls,
        doc: Mapping[str, Any],
        *,
        layout: str,
        validated: bool,
        validation_note: str,
        next_tokens: Mapping[str, int],
    ) -> ParityFacts:
        manifest, settings = doc["manifest"], doc["settings"]
        return cls(
            layout=layout,
            device_count=manifest["hardware"]["device_count"],
            device_type=manifest["hardware"]["device_type"],
            model=tuple((key, repr(manifest["model"][key])) for key in MODEL_IDENTITY_KEYS),
            routing=settings["expert_balancing"]["routing"],
            workload_digest=doc["workload"]["dataset"]["digest"],
            prefix_caching=settings["prefix_cache"]["enabled"],
            cache_phase=settings["prefix_cache"].get("phase", "cold"),
            chunk_size=settings["chunked_prefill"]["chunk_size"],
            warmups=doc["protocol"]["warmups"],
            repetitions=doc["protocol"]["repetitions"],
            run_order=doc["protocol"]["run_order"],
            validated=validated,
            validation_note=validation_note,
            next_tokens=tuple(sorted(next_tokens.items())),
        )

    def to_json(self) -> dict[str, Any]:
        facts = asdict(self)
        facts["model"] = dict(self.model)
        facts["next_tokens"] = dict(self.next_tokens)
        return facts


@dataclass(frozen=True)
class ParityVerdict:
    comparability: str
    reasons: tuple[str, ...]

    def labels(self) -> dict[str, str]:
        """The result's ``labels`` fields (``synthetic`` is set by the routing, not here)."""
        reason = "; ".join(self.reasons) if self.reasons else "parity established"
        return {"comparability": self.comparability, "comparability_reason": reason}

    def to_json(self) -> dict[str, Any]:
        return {"comparability": self.comparability, "reasons": list(self.reasons)}


def parity_check(reference: ParityFacts, candidate: ParityFacts) -> ParityVerdict:
    """Comparable only when every RFC condition holds on both sides; else every miss named."""
    reasons = []
    for name, what in PARITY_FIELDS:
        mine, theirs = getattr(reference, name), getattr(candidate, name)
        if mine != theirs:
            reasons.append(
                f"{what} differs: {reference.layout} {mine!r} vs {candidate.layout} {theirs!r}"
            )
    for side in (reference, candidate):
        if side.routing != NATURAL_ROUTING:
            reasons.append(f"{side.layout} uses {side.routing!r} routing, not natural")
        if not side.validated:
            reasons.append(side.validation_note)
    if reference.next_tokens != candidate.next_tokens:
        reasons.append(
            f"greedy next tokens differ between {reference.layout} and {candidate.layout}: "
            "correctness parity not established"
        )
    return ParityVerdict(EXPLORATORY if reasons else COMPARABLE, tuple(reasons))


def pp_layout_for(topology: Topology) -> str:
    """A PP layout with the same total device count: ``pp{N/pcp}pcp{pcp}`` (else ``pp{N}``).

    Keeps the AFD layout's PCP width when it divides the device count, so the
    two sides differ in how layers are placed, not in context parallelism.
    """
    devices = topology.devices_needed
    pcp = topology.attention.size("pcp")
    if pcp > 1 and devices % pcp == 0:
        return f"pp{devices // pcp}pcp{pcp}"
    return f"pp{devices}"
