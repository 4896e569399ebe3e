"""Helpers shared by the gate modules: topologies, settings, prompts, split check, verdict, evidence.

Every gate compares a candidate run with a reference run of the same backend
and judges it with the ``golden`` fixture's tolerance profile (``w8a8`` for
W8A8 runs, ``float32`` otherwise). Where the backend
declares ``split_observer`` (the CPU backend) the judgement also includes the
split invariant checker (``afd_split.validate_split`` and parent-unchanged)
applied, through the backend protocol, to exactly the split metadata the
executor consumed, so a broken split is caught even where it happens not to
move the outputs. The reference (``split_policy="none"``) is a direct
whole-batch forward that must not touch the split path. See docs/gates.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
from gate_reference import comparable_outputs

from afd_split import SplitInvariantError, SplitSupportConfig, validate_split
from afd_split.support import CPU_REFERENCE_BUILDER
from pytest_afd import results
from pytest_afd.backends import create_backend
from pytest_afd.backends.base import (
    CAP_SPLIT_OBSERVER,
    Backend,
    PromptRequest,
    RunOutputs,
    RunSettings,
    observe_splits,
)
from pytest_afd.golden import GoldenMismatchError, GoldenStore, compare, get_profile
from pytest_afd.plugin import AfdOptions
from pytest_afd.topology import Topology, parse_topology

CPU_BACKEND = "cpu"
# Small KV pages so prompts of a few hundred tokens span many blocks: prefix
# hits, partial-block reuse and page-aligned chunks all happen at CPU sizes.
GATE_BLOCK_SIZE = 16
# Token ids are drawn below the CPU model's vocabulary (real vocabularies are larger).
PROMPT_VOCAB = 2048
# The topologies whose split arithmetic the CPU backend emulates exactly
# (Topology.cpu_emulation): the recipe's AFD and baseline layouts, a TP-aligned
# AFD layout, and PCP padding combined with TP alignment.
SUPPORTED_CPU_TOPOLOGIES = ("dp3pcp8-ep8", "dp4pcp8", "dp2tp4-ep8", "dp2pcp2tp2-ep4")
# Attention builder the split path is validated for on each backend.
BACKEND_ATTENTION_BUILDERS = MappingProxyType({CPU_BACKEND: CPU_REFERENCE_BUILDER})
NPU_ATTENTION_BUILDER = "AscendSFAMetadataBuilder"
QUANT_NONE = "none"
QUANT_W8A8 = "w8a8"
TOLERANCE_PROFILES = MappingProxyType({QUANT_NONE: "float32", QUANT_W8A8: "w8a8"})
UNSPLIT_POLICY = "none"
SPLIT_POLICY = "token_balanced"


# ---- topologies ------------------------------------------------------------


def gate_topology_specs(options: AfdOptions) -> list[str]:
    """The session's ``--npu-topology`` first, then the other supported CPU topologies.

    A non-CPU backend is one deployment: it runs only the topology it was
    launched with.
    """
    session = options.topology.canonical
    if options.backend != CPU_BACKEND:
        return [session]
    return list(dict.fromkeys((session, *SUPPORTED_CPU_TOPOLOGIES)))


def afd_topology_specs(options: AfdOptions) -> list[str]:
    """The AFD (Attention + FFN) topologies among the gate topologies: the CPU AFD runtime's.

    Only the CPU backend has the in-repo process-pair runtime; elsewhere the
    backend's own AFD deployment is covered through ``Backend.run``.
    """
    if options.backend != CPU_BACKEND:
        return []
    return [s for s in gate_topology_specs(options) if parse_topology(s, options.aliases).is_afd]


def gate_quantization_cases(specs: Sequence[str]) -> list[tuple[str, str]]:
    """Every topology unquantized, plus W8A8 on the first (the session's) topology.

    The split arithmetic depends on the topology, not on the precision, and
    W8A8 quantizes per token (row), so a split cannot change what a token sees;
    one W8A8 topology checks that per-row property at the ``w8a8`` tolerance
    without doubling the sweep.
    """
    return [(spec, QUANT_NONE) for spec in specs] + [(specs[0], QUANT_W8A8)]


def support_config_for(
    topology: Topology, backend_name: str, **overrides: Any
) -> SplitSupportConfig:
    """The fail-closed support facts of running the token split on ``topology``."""
    attention = topology.attention
    facts = {
        "attention_builder": BACKEND_ATTENTION_BUILDERS.get(backend_name, NPU_ATTENTION_BUILDER),
        "pcp_size": attention.size("pcp"),
        "tp_size": max(attention.size("tp"), attention.size("sp")),
        "dcp_size": attention.size("dcp"),
    }
    return SplitSupportConfig(**{**facts, **overrides})


ManifestMaker = Callable[[Backend | None, Topology, str], dict]


@dataclass
class GateBackends:
    """One backend per (topology, model) for the CPU backend, each with its own manifest.

    ``make_manifest(backend, topology, model)`` builds the manifest a case on
    that backend records (its true topology and model, not the session's).
    """

    options: AfdOptions
    session_backend: Callable[[], Backend]
    make_manifest: ManifestMaker
    session_manifest: Callable[[], dict]
    created: dict[tuple[str, str], Backend] = field(default_factory=dict)
    manifests: dict[tuple[str, str], dict] = field(default_factory=dict)

    def manifest(self, spec: str, model_name: str | None = None, *, backend: bool = True) -> dict:
        """The manifest of cases on (``spec``, model); ``backend=False``: no backend ran."""
        model = model_name or self.options.model
        topology = parse_topology(spec, self.options.aliases)
        if self.options.backend != CPU_BACKEND:
            return self.session_manifest()
        key = (topology.canonical, model, backend)
        if key not in self.manifests:
            ran = self.get(spec, model) if backend else None
            self.manifests[key] = self.make_manifest(ran, topology, model)
        return self.manifests[key]

    def get(self, spec: str, model_name: str | None = None) -> Backend:
        model = model_name or self.options.model
        topology = parse_topology(spec, self.options.aliases)
        if self.options.backend != CPU_BACKEND:
            deployment_mismatch(self.options, topology, model)
            return self.session_backend()
        key = (topology.canonical, model)
        if key not in self.created:
            self.created[key] = create_backend(
                CPU_BACKEND,
                topology=topology,
                model_name=model,
                seed=self.options.seed,
                results_dir=self.options.results_dir,
                peer_timeout_s=self.options.peer_timeout_s,
            )
        return self.created[key]

    def close(self) -> None:
        for backend in self.created.values():
            backend.close()
        self.created.clear()


def deployment_mismatch(options: AfdOptions, topology: Topology, model: str) -> None:
    """Skip, naming only what differs, when a case needs another deployment than the session's."""
    differences = []
    if topology.canonical != options.topology.canonical:
        differences.append(f"--npu-topology {topology.canonical} (this session: "
                           f"{options.topology.canonical})")
    if model != options.model:
        differences.append(f"--afd-model {model} (this session: {options.model})")
    if differences:
        pytest.skip(
            f"backend {options.backend!r} runs the one deployment of this session; this case "
            f"needs {' and '.join(differences)}: run it in a session with those options"
        )


@dataclass(frozen=True)
class PageScale:
    """Token counts are written for 16-token CPU pages; scaled to the backend's KV page.

    Cases are about pages (a prefix of six whole pages, a chunk tail shorter
    than a page), so on a backend with 128-token pages every count grows by 8
    and each case keeps its shape.
    """

    block_size: int

    @property
    def factor(self) -> int:
        return self.block_size // GATE_BLOCK_SIZE

    def tokens(self, count: int | None) -> int | None:
        return None if count is None else count * self.factor

    def lengths(self, counts: Sequence[int]) -> tuple[int, ...]:
        return tuple(count * self.factor for count in counts)


def page_scale(backend_name: str) -> PageScale:
    """16-token pages on the CPU backend; the deployment's default page elsewhere."""
    block_size = GATE_BLOCK_SIZE if backend_name == CPU_BACKEND else RunSettings().block_size
    if block_size % GATE_BLOCK_SIZE:
        raise ValueError(f"block_size={block_size} is not a multiple of {GATE_BLOCK_SIZE}")
    return PageScale(block_size)


def gate_settings(topology: Topology, pages: PageScale, **overrides: Any) -> RunSettings:
    """RunSettings for ``topology``: its split alignment / PCP size, the page size, overrides."""
    emulation = topology.cpu_emulation()
    defaults = {
        "split_align": emulation.split_align,
        "pcp_size": emulation.pcp_size,
        "block_size": pages.block_size,
    }
    return RunSettings(**{**defaults, **overrides})


# ---- prompts -----------------------------------------------------------------


def make_prompts(
    lengths: Sequence[int], seed: int, *, prefix: Sequence[int] = (), tag: str = "r"
) -> list[PromptRequest]:
    """Deterministic prompts: ``prefix`` followed by ``length`` random ids each."""
    rng = np.random.default_rng(seed)
    return [
        PromptRequest(
            f"{tag}{index}", tuple(prefix) + tuple(int(t) for t in rng.integers(0, PROMPT_VOCAB, n))
        )
        for index, n in enumerate(lengths)
    ]


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

    A :class:`~pytest_afd.backends.base.SplitObserver`: it keeps each plan's
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
    """:data:`NO_STEP_EVIDENCE` when the run carries no step evidence, else None."""
    return None if outputs.steps else NO_STEP_EVIDENCE


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
