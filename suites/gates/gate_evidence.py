"""Gate evidence: the result JSON of a gate or a recorded reference, and what the run's own
per-step evidence says happened (split steps, final chunk sizes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_afd.core.backend import (
    Backend,
    PromptRequest,
    RunOutputs,
    RunSettings,
)
from pytest_afd.results import documents as results
from pytest_afd.topology.spec import Topology

# ---- evidence ------------------------------------------------------------------


def record_gate_result(
    afd_results,
    *,
    manifest: dict[str, Any],
    settings: RunSettings,
    topology: Topology,
    prompts: Sequence[PromptRequest],
    outputs: RunOutputs | None,
    gate: dict[str, Any],
    dataset: str,
    seed: int | None,
    requested_hit_ratio: float | None = None,
) -> None:
    """Write this case's schema-valid result JSON; ``gate`` holds the gate's own evidence.

    ``manifest`` is the case's own (``GateBackends.manifest``): its topology,
    model and backend, which ``results.build_result`` turns into ``run``.
    """
    gate_doc = {
        **gate,
        "topology": topology.canonical,
        "cpu_emulation": topology.cpu_emulation().to_json(),
    }
    if outputs is None:
        evidence = {
            "steps": results.absent("this gate runs no prefill through the backend"),
            "tokens": results.absent("this gate runs no prefill through the backend"),
            "prefix_cache": results.absent("this gate runs no prefill through the backend"),
            "per_layer_timings": results.absent("correctness gate: not instrumented"),
            "expert_load": results.absent("this gate runs no prefill through the backend"),
            "gate": gate_doc,
        }
        completed = 0
    else:
        evidence = results.evidence_from_outputs(
            outputs,
            routing=settings.routing,
            num_ep_ranks=topology.num_ep_ranks,
            requested_hit_ratio=requested_hit_ratio,
            gate=gate_doc,
        )
        completed = sum(r.error is None for r in outputs.requests)
    afd_results.record(
        manifest=manifest,
        settings=settings,
        workload=results.workload_json(
            dataset_name=dataset,
            prompt_lengths=[p.num_prompt_tokens for p in prompts],
            seed=seed,
        ),
        metrics=results.metrics_json(
            completed_requests=completed,
            failed_requests=0 if outputs is None else len(outputs.requests) - completed,
        ),
        evidence=evidence,
        notes="correctness gate (docs/gates.md): evidence.gate holds the verdict",
    )


def record_reference_case(
    afd_results,
    references: Any,
    name: str,
    backend: Backend,
    prompts: Sequence[PromptRequest],
    settings: RunSettings,
    *,
    topology: Topology,
    gate: dict[str, Any],
    dataset: str,
    seed: int | None,
    manifest: dict[str, Any],
) -> None:
    """Reference phase (``--afd-reference-phase record``): run, store and report the reference only."""
    from gate_reference import reference_settings

    outputs = references.record(name, backend, prompts, settings)
    record_gate_result(
        afd_results,
        manifest=manifest,
        settings=reference_settings(settings),
        topology=topology,
        prompts=prompts,
        outputs=outputs,
        dataset=dataset,
        seed=seed,
        gate={**gate, **references.describe(name)},
    )


# ---- what the run's own evidence says happened ---------------------------------------

STEP_KEYS = ("is_split", "boundary_request", "schedule")
SCHEDULE_KEYS = ("requests", "num_scheduled_tokens", "num_computed_tokens")


@dataclass(frozen=True)
class SplitStep:
    """One split forward as the backend reported it (request indices are the run's)."""

    step: int
    boundary_request: int | None  # None: the cut fell on a request boundary
    boundary_computed: int  # tokens already in the KV cache for the boundary request
    boundary_is_final: bool  # the boundary piece ends its prompt
    requests: tuple[int, ...]


def _require(mapping: dict, keys: Sequence[str], where: str) -> None:
    missing = [key for key in keys if key not in mapping]
    if missing:
        raise AssertionError(f"{where} lacks {missing}: the gate reads the split shape from it")


# Why a gate's shape assertion is not made: said in its result, never silently passed.
NO_STEP_EVIDENCE = (
    "the backend reported no per-step evidence (a deployment behind an HTTP API): the split/chunk "
    "shape of this case is not verified, only its outputs"
)


def shape_unverified(outputs: RunOutputs) -> str | None:
    """:data:`NO_STEP_EVIDENCE` (and the backend's reason) when the run carries no step
    evidence, else None."""
    if outputs.steps:
        return None
    reason = outputs.steps_absent_reason
    return NO_STEP_EVIDENCE if reason is None else f"{NO_STEP_EVIDENCE} ({reason})"


def step_derived(outputs: RunOutputs, value: Any) -> Any:
    """``value`` read from the run's steps, or the absent record with the reason when the
    run has none (a count of 0 or an empty list would claim the shape was seen)."""
    return value if outputs.steps else results.absent(shape_unverified(outputs))


def split_steps(outputs: RunOutputs, prompt_lengths: Sequence[int]) -> list[SplitStep]:
    """The run's split forwards, from ``RunOutputs.steps`` (plan evidence + schedule)."""
    found = []
    for index, step in enumerate(outputs.steps):
        _require(step, STEP_KEYS, f"step {index} evidence")
        schedule = step["schedule"]
        _require(schedule, SCHEDULE_KEYS, f"step {index} schedule evidence")
        if not step["is_split"]:
            continue
        local = step["boundary_request"]
        requests = tuple(int(r) for r in schedule["requests"])
        if local is None:
            found.append(SplitStep(index, None, 0, True, requests))
            continue
        request = requests[local]
        computed = int(schedule["num_computed_tokens"][local])
        scheduled = int(schedule["num_scheduled_tokens"][local])
        is_final = computed + scheduled == prompt_lengths[request]
        found.append(SplitStep(index, request, computed, is_final, requests))
    return found


def final_chunk_tokens(outputs: RunOutputs, prompt_lengths: Sequence[int]) -> dict[int, int]:
    """Tokens of each request's last scheduled piece, for requests spread over several forwards."""
    pieces: dict[int, list[int]] = {}
    for index, step in enumerate(outputs.steps):
        _require(step, ("schedule",), f"step {index} evidence")
        schedule = step["schedule"]
        _require(schedule, SCHEDULE_KEYS, f"step {index} schedule evidence")
        for request, scheduled in zip(
            schedule["requests"], schedule["num_scheduled_tokens"], strict=True
        ):
            pieces.setdefault(int(request), []).append(int(scheduled))
    for request, sizes in pieces.items():
        if sum(sizes) > prompt_lengths[request]:
            raise AssertionError(
                f"request {request} was scheduled {sum(sizes)} tokens for a "
                f"{prompt_lengths[request]}-token prompt"
            )
    return {request: sizes[-1] for request, sizes in pieces.items() if len(sizes) > 1}
