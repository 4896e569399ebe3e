"""The gate's split check and verdict: executed splits, measured runs, judge (see docs/gates.md)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from gate_reference import comparable_outputs
from gate_setup import (
    UNSPLIT_POLICY,
)

from afd_split import SplitInvariantError
from afd_split.checks.metadata import validate_split
from pytest_afd.core.backend import (
    CAP_SPLIT_OBSERVER,
    Backend,
    PromptRequest,
    RunOutputs,
    RunSettings,
    observe_splits,
)
from pytest_afd.golden.store import GoldenMismatchError, GoldenStore, compare, get_profile

# ---- the split check and the verdict -----------------------------------------


PARENT_FIELDS = (
    "query_start_loc", "seq_lens", "num_computed_tokens", "slot_mapping", "block_table",
    "positions", "block_size",
)  # fmt: skip


def _parent_snapshot(metadata) -> dict[str, Any]:
    """Copies of every parent field, to prove the split left the parent untouched."""
    return {name: np.array(getattr(metadata, name), copy=True) for name in PARENT_FIELDS}


@dataclass
class ExecutedSplits:
    """What the backend's executor split during one run, and the invariant violations in it.

    A :class:`~pytest_afd.core.backend.SplitObserver`: it keeps each plan's
    evidence (never the plan, metadata or parts themselves, which must die
    with their step) and checks every split with ``validate_split`` plus the
    parent-never-mutated rule, on exactly the parts the executor ran.
    """

    validate: bool = True
    plan_evidence: list[dict[str, Any]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    active: bool = True
    _pending: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def num_checked(self) -> int:
        return len(self.plan_evidence)

    @property
    def num_split(self) -> int:
        return sum(bool(evidence["is_split"]) for evidence in self.plan_evidence)

    def before_split(self, plan, metadata) -> None:
        self._pending[id(metadata)] = _parent_snapshot(metadata)

    def after_split(self, plan, metadata, parts) -> None:
        forward = len(self.plan_evidence)
        before = self._pending.pop(id(metadata))
        if self.validate:
            try:
                validate_split(plan, metadata, parts)
            except SplitInvariantError as error:
                self.violations.append(f"forward {forward}: {error}")
            changed = [
                name for name, value in before.items()
                if not np.array_equal(np.asarray(getattr(metadata, name)), value)
            ]  # fmt: skip
            if changed:
                self.violations.append(f"forward {forward}: the split mutated the parent's {changed}")
        self.plan_evidence.append(plan.to_evidence())


@contextmanager
def checked_splits(backend: Backend, *, validate: bool = True, expect_splits: bool = True,
                   in_reach: bool = True) -> Iterator[ExecutedSplits]:
    """Run the invariant checker on every split the backend executes inside the block.

    Through the backend protocol's ``observe_splits`` (capability
    ``split_observer``). ``expect_splits``: a split run whose observer saw no
    split means the seam moved and the check would be vacuous (a failure); an
    unsplit reference run must see none (it is a direct whole-batch forward,
    independent of the split path). A backend without the capability splits
    out of reach (its own processes), and so does a run with ``afd_processes``
    (``in_reach=False``): nothing is checked here.
    """
    active = in_reach and CAP_SPLIT_OBSERVER in backend.capabilities
    record = ExecutedSplits(validate=validate, active=active)
    if not record.active:
        yield record
        return
    with observe_splits(backend, record):
        yield record
    if expect_splits and not record.plan_evidence:
        raise AssertionError(
            f"backend {backend.name!r} reported no split through its split observer: "
            "its split seam moved, so the invariant check would be vacuous"
        )
    if not expect_splits and record.plan_evidence:
        raise AssertionError(
            f"the unsplit reference ran {len(record.plan_evidence)} forward(s) through the split "
            "path: it would share the code the gate judges"
        )


def run_measured(
    backend: Backend,
    prompts: Sequence[PromptRequest],
    settings: RunSettings,
    *,
    seed_prompts: Sequence[Sequence[PromptRequest]] = (),
    validate: bool = True,
    seed_split: str = UNSPLIT_POLICY,
) -> tuple[RunOutputs, ExecutedSplits]:
    """Cold cache, seed runs (unsplit, prefix caching on), then the measured run under the checker.

    The seed runs put the same prefix KV in the cache for a candidate and its
    reference, so the two differ only in what the measured run does. A
    reference (``split_policy="none"``) must not touch the split path. Against
    a stored reference (``--afd-reference-phase check``) the deployment has one
    split, so the seed runs use it (``seed_split``).
    """
    backend.reset_prefix_cache()
    seed_settings = replace(settings, split_policy=seed_split, prefix_caching=True)
    for seed in seed_prompts:
        backend.run(seed, seed_settings)
    reference = settings.split_policy == UNSPLIT_POLICY
    with checked_splits(backend, validate=validate, expect_splits=not reference,
                        in_reach=not settings.afd_processes) as splits:
        outputs = backend.run(prompts, settings)
    return outputs, splits


def stacked_logits(outputs: RunOutputs) -> np.ndarray:
    """[R, vocab] last-token logits in request order; a backend without logits fails the gate."""
    missing = [r.request_id for r in outputs.requests if r.logits is None]
    if missing:
        raise AssertionError(f"requests {missing} returned no logits; the gate compares logits")
    return np.stack([np.asarray(r.logits, dtype=np.float32) for r in outputs.requests])


class GateRejected(AssertionError):
    """The gate's comparison rejected the candidate run (tolerance or invariant)."""


@dataclass
class GateVerdict:
    """Outcome of comparing a candidate run with its reference."""

    profile: str
    ok_outputs: bool
    report: str
    max_abs_error: float | None
    max_rel_error: float | None
    violations: list[str]
    token_mismatches: list[str]
    checked_forwards: int

    @property
    def ok(self) -> bool:
        return self.ok_outputs and not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "tolerance_profile": get_profile(self.profile).describe(),
            "outputs_within_tolerance": self.ok_outputs,
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
            "report": self.report,
            "invariant_violations": self.violations,
            "invariant_checked_forwards": self.checked_forwards,
            "greedy_token_mismatches": self.token_mismatches,
        }

    def raise_if_rejected(self) -> None:
        if self.ok:
            return
        reasons = []
        if self.violations:
            reasons.append("split invariant violated: " + "; ".join(self.violations))
        if not self.ok_outputs:
            reasons.append(f"outputs differ beyond {self.profile}: {self.report}")
        raise GateRejected(" | ".join(reasons))


def judge(
    golden: GoldenStore,
    name: str,
    candidate: RunOutputs,
    reference: RunOutputs,
    profile: str,
    splits: ExecutedSplits | None = None,
) -> GateVerdict:
    """The gate's comparison: same requests, logits within ``profile``, no invariant violation."""
    ids = [r.request_id for r in candidate.requests]
    ref_ids = [r.request_id for r in reference.requests]
    if ids != ref_ids:
        raise AssertionError(f"candidate requests {ids} != reference requests {ref_ids}")
    outputs = comparable_outputs(candidate, reference, profile)
    actual, expected, profile = outputs.actual, outputs.expected, outputs.profile
    try:
        golden.check(name, actual, profile=profile, reference=expected)
        ok, report = True, ""
    except GoldenMismatchError as mismatch:
        ok, report = False, str(mismatch)
    numbers = compare(actual, expected, profile)
    if outputs.shared_logprob_error is not None:
        numbers.max_abs_error = outputs.shared_logprob_error
    tokens = [
        f"{c.request_id}: {c.next_token} vs {r.next_token}"
        for c, r in zip(candidate.requests, reference.requests, strict=True)
        if c.next_token != r.next_token
    ]
    return GateVerdict(
        profile=profile,
        ok_outputs=ok,
        report=report,
        max_abs_error=numbers.max_abs_error,
        max_rel_error=numbers.max_rel_error,
        violations=list(splits.violations) if splits is not None else [],
        token_mismatches=tokens,
        checked_forwards=splits.num_checked if splits is not None else 0,
    )
