"""The per-step glue every engine path runs: plan, request-level check, evidence record.

One set of functions for the AFD-plugin hook and the harness's CPU backend, so
the CPU gates exercise exactly the planning, checking and evidence code that
runs inside the Ascend workers. Nothing here reads a device tensor: the inputs
are the host-side per-request arrays the engine already holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from afd_split.checks.request_checks import validate_split_requests
from afd_split.checks.requests import RequestFields, split_request_fields
from afd_split.hook.planning.threshold import (
    below_split_threshold,
    below_threshold_reason,
    scheduled_total,
)
from afd_split.hook.planning.worker_evidence import EVIDENCE_FORMAT, RECORD_KIND
from afd_split.plan.agree import agree_on_split
from afd_split.plan.constraints import SplitConstraints, SplitPolicy
from afd_split.plan.planner import SplitPlan, plan_split, plan_unsplit

AGREE_DEBUG_ENV = "AFD_SPLIT_DEBUG_AGREE"
"""Set to 1: every step all-gathers the plan fingerprint over the engine's TP/PCP groups."""

AGREE_DEBUG_ON = "1"

REQUEST_IDS_FIELD = "request_ids"
"""Step-line field: the engine's request ids of the step, in batch order."""

EXPERT_LOAD_NDIM = 2
"""expert_load is [moe layers, routed experts]."""

EXPERT_LOAD_ABSENT = ("routed top-k ids are not at hand where the step is planned; the AFD "
                      "hook writes them after the forward in the step's afd_expert_load line")


@dataclass(frozen=True)
class StepRanks:
    """Where a step ran; recorded in every evidence line (one file per Attention rank)."""

    global_rank: int
    dp_rank: int = 0
    tp_rank: int = 0
    pcp_rank: int = 0

    @property
    def label(self) -> str:
        """File label of this rank's evidence."""
        return f"attention-rank{self.global_rank}"

    def to_dict(self) -> dict[str, int]:
        return {
            "global_rank": self.global_rank,
            "dp_rank": self.dp_rank,
            "tp_rank": self.tp_rank,
            "pcp_rank": self.pcp_rank,
        }


def plan_engine_step(
    num_scheduled_tokens,
    *,
    policy: SplitPolicy | str,
    constraints: SplitConstraints,
    num_computed_tokens=None,
    min_split_tokens: int = 0,
) -> SplitPlan:
    """The step's plan; a batch the policy cannot split runs unsplit with its reason recorded,
    and so does one of fewer than ``min_split_tokens`` tokens (``threshold``; 0: none).

    Deterministic by construction: the plan is a pure function of the scheduled
    and computed token counts, which every TP/SP/PCP rank of a replica receives
    from the same scheduler output.
    """
    if min_split_tokens:
        total = scheduled_total(num_scheduled_tokens)
        if below_split_threshold(total, min_split_tokens):
            return plan_unsplit(num_scheduled_tokens, policy=policy, constraints=constraints,
                                reason=below_threshold_reason(total, min_split_tokens),
                                num_computed_tokens=num_computed_tokens)
    return plan_split(
        num_scheduled_tokens,
        policy=policy,
        constraints=constraints,
        allow_fallback=True,
        num_computed_tokens=num_computed_tokens,
    )


def agreement_enabled(environ: Mapping[str, str]) -> bool:
    """The debug-mode fingerprint check is on (``AFD_SPLIT_DEBUG_AGREE=1``)."""
    value = environ.get(AGREE_DEBUG_ENV, "")
    if value not in ("", "0", AGREE_DEBUG_ON):
        raise ValueError(f"{AGREE_DEBUG_ENV}={value!r}; expected 0 or 1")
    return value == AGREE_DEBUG_ON


def agree_across_groups(plan: SplitPlan, groups: Sequence[Any], *, device="cpu") -> None:
    """One fingerprint all-gather per group (the engine's TP, then PCP group)."""
    for group in groups:
        agree_on_split(plan, group, device=device)


def check_engine_step(plan: SplitPlan, parent: RequestFields,
                      parts: Sequence[RequestFields] | None = None) -> list[RequestFields]:
    """The cheap request-level check every step runs; returns the checked per-ubatch fields.

    ``parts`` are the request-level fields the engine's sliced metadata really
    carries (read back from the adapter's output); ``None`` checks the plan's
    own split of ``parent``. Raises ``SplitInvariantError`` naming the invariant.
    """
    if parts is None:
        parts = split_request_fields(plan, parent)
    validate_split_requests(plan, parent, parts)
    return list(parts)


def expert_load_entry(expert_load) -> Any:
    """Per-layer routed tokens per expert as plain ints, or the absent form with its reason."""
    if expert_load is None:
        return {"value": None, "absent_reason": EXPERT_LOAD_ABSENT}
    array = np.asarray(expert_load)
    if array.ndim != EXPERT_LOAD_NDIM or array.dtype.kind not in "iu":
        raise ValueError(
            f"expert_load must be an integer [layers, experts] array, got shape {array.shape} "
            f"dtype {array.dtype}"
        )
    return array.tolist()


def step_record(plan: SplitPlan, *, step: int, ranks: StepRanks, expert_load=None,
                request_ids: Sequence[str] | None = None, **facts: Any) -> dict[str, Any]:
    """One evidence line: the plan's evidence, where it ran, and per-layer expert load.

    ``request_ids`` are the engine's ids of the step's requests in batch order: a
    reader joins the line to its client's requests by id, since a server numbers
    requests in its own arrival order, not the client's.
    """
    return {
        "kind": RECORD_KIND,
        "format": EVIDENCE_FORMAT,
        "step": step,
        "ranks": ranks.to_dict(),
        **plan.to_evidence(),
        "expert_load": expert_load_entry(expert_load),
        **({} if request_ids is None else {REQUEST_IDS_FIELD: [str(r) for r in request_ids]}),
        **facts,
    }
