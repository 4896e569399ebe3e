"""Shared fixtures of the RFC stage suites (``suites/stage_a`` … ``suites/stage_f``).

Every stage measures the same way (the RFC's "reproducible benchmark harness"):
``warmups`` discarded runs per case, then ``>= 3`` measured repetitions in the
session's run order (interleaved by default, so drift hits every case alike),
headline metrics only from non-instrumented runs, and one extra instrumented
run per case only to explain (never for headline numbers). :class:`StageRunner`
implements that once on top of ``afd_options.repeat`` and writes one
schema-valid result per case through ``afd_results``. At the end of a session
that wrote stage results, the Markdown + PNG report is rendered into
``<results dir>/report/``.

Sizes: the RFC's logical sizes (8 requests, 65,536 prompt tokens, 128-token
KV blocks, 140,000 max batched tokens) are multiplied by the stage scale:
``--afd-stage-scale`` / ``$AFD_STAGE_SCALE``, default 1/64 on the CPU backend
(so a stage runs in minutes) and 1 elsewhere (the real study).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest

from pytest_afd import host as afd_host
from pytest_afd import progress as afd_progress
from pytest_afd import results as afd_result_docs
from pytest_afd.backends import create_backend
from pytest_afd.backends.base import (
    CAP_CHUNKED_PREFILL,
    CAP_FORCED_ROUTING,
    CAP_INSTRUMENTATION,
    CAP_PREFIX_CACHE,
    CAP_SPLIT,
    CAP_W8A8,
    Backend,
    BackendUnavailable,
    RunOutputs,
    RunSettings,
)
from pytest_afd.manifest import collect_manifest, manifest_digest
from pytest_afd.plugin import afd_session
from pytest_afd.results import is_absent, validate_manifest
from pytest_afd.stats import summarize
from pytest_afd.topology import Topology, parse_topology
from pytest_afd.workloads import Workload, make_workload

# --- the RFC's logical sizes (recipe values), scaled per backend ---------------
LOGICAL_NUM_REQUESTS = 8  # the recipe's --max-num-seqs
LOGICAL_TOTAL_TOKENS = 65_536  # same total for every distribution (Stage C)
RECIPE_BLOCK_SIZE = 128
RECIPE_MAX_BATCHED_TOKENS = 140_000
# Token ids below this exist in every tokenizer the suites meet (CPU model: 2048).
WORKLOAD_VOCAB_SIZE = 1024
STAGE_SCALE_ENV = "AFD_STAGE_SCALE"
STAGE_SCALE_OPTION = "--afd-stage-scale"
# Backends that need scaled-down stages to run in minutes; the rest run at 1.
DEFAULT_STAGE_SCALES = MappingProxyType({"cpu": 1 / 64})
FULL_SCALE = 1.0

# --- cache phases ------------------------------------------------------------------
PHASE_COLD = "cold"  # prefix cache dropped before every run
PHASE_STEADY = "steady"  # dropped, then the shared prefix seeded, before every run
PHASES = (PHASE_COLD, PHASE_STEADY)

STAGE_KINDS = ("stage_a", "stage_b", "stage_c", "stage_d", "stage_e", "stage_f")
THROUGHPUT_METRIC = "prefill_tokens_per_s"
NO_STEP_EVIDENCE = "the backend reported no per-step split evidence"


# --- options -------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("afd").addoption(
        STAGE_SCALE_OPTION,
        dest="afd_stage_scale",
        default=None,
        help="stage suites: factor on the RFC's logical sizes (tokens, blocks, budgets); "
        f"default 1/64 on the cpu backend, 1 otherwise [env {STAGE_SCALE_ENV}]",
    )


@pytest.hookimpl(trylast=True)  # after the plugin resolved the --afd-* options
def pytest_configure(config: pytest.Config) -> None:
    """A bad stage scale is a usage error at start-up, not a failure in every stage test."""
    stage_scale(config, afd_session(config).options.backend)


def parse_scale(text: str, source: str) -> float:
    """A positive factor, given as a float or a fraction like ``1/64``."""
    try:
        numerator, _, denominator = text.partition("/")
        value = float(numerator) / float(denominator) if denominator else float(numerator)
    except (ValueError, ZeroDivisionError):
        raise pytest.UsageError(f"{source}={text!r}: expected a number like 0.5 or 1/64") from None
    if not (math.isfinite(value) and 0 < value <= FULL_SCALE):
        raise pytest.UsageError(f"{source}={text!r}: expected a factor in (0, 1]")
    return value


def stage_scale(config: pytest.Config, backend_name: str) -> float:
    given = config.getoption("afd_stage_scale", default=None)
    if given is not None:
        return parse_scale(given, STAGE_SCALE_OPTION)
    if os.environ.get(STAGE_SCALE_ENV):
        return parse_scale(os.environ[STAGE_SCALE_ENV], f"${STAGE_SCALE_ENV}")
    return DEFAULT_STAGE_SCALES.get(backend_name, FULL_SCALE)


def power_of_two_at_most(value: float) -> int:
    """The largest power of two <= value (at least 1): block sizes must be powers of two."""
    return 1 << max(0, math.floor(math.log2(max(value, 1.0))))


@dataclass(frozen=True)
class StageSizes:
    """The logical recipe sizes times the stage scale."""

    scale: float

    @property
    def block_size(self) -> int:
        return power_of_two_at_most(RECIPE_BLOCK_SIZE * self.scale)

    @property
    def max_batched_tokens(self) -> int:
        return max(self.block_size, round(RECIPE_MAX_BATCHED_TOKENS * self.scale))

    def tokens(self, logical: int) -> int:
        """A logical token count (a chunk size, a budget) at this scale, >= one block."""
        return max(self.block_size, round(logical * self.scale))

    def to_json(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "block_size": self.block_size,
            "max_batched_tokens": self.max_batched_tokens,
            "logical_total_tokens": LOGICAL_TOTAL_TOKENS,
            "num_requests": LOGICAL_NUM_REQUESTS,
        }


# --- backends other than the session's (another model depth or topology) ------------
@dataclass
class BackendHandle:
    """A backend with the manifest its results embed (model and topology differ per handle)."""

    backend: Backend
    manifest: dict[str, Any]
    topology: Topology
    model_name: str


class BackendPool:
    """The session backend plus, on demand, backends for another model or topology.

    Stage A repeats cases on ``full``, Stage E crosses depth with routing and
    Stage F runs a PP layout; each needs its own backend and manifest. Made
    with the public factory, cached for the session, closed at its end.
    """

    def __init__(self, config: pytest.Config, session: BackendHandle) -> None:
        self.config = config
        self.options = afd_session(config).options
        self.session = session
        self._made: dict[tuple[str, str], BackendHandle] = {}

    def get(
        self, *, model_name: str | None = None, topology_spec: str | None = None
    ) -> BackendHandle:
        model = model_name or self.session.model_name
        topology = (
            self.session.topology
            if topology_spec is None
            else parse_topology(topology_spec, self.options.aliases)
        )
        if (
            model == self.session.model_name
            and topology.canonical == self.session.topology.canonical
        ):
            return self.session
        key = (model, topology.canonical)
        if key not in self._made:
            try:
                backend = create_backend(
                    self.options.backend,
                    topology=topology,
                    model_name=model,
                    seed=self.options.seed,
                    results_dir=self.options.results_dir,
                )
            except BackendUnavailable as exc:
                pytest.skip(
                    f"backend {self.options.backend!r} for model {model!r} on {topology}: {exc}"
                )
            self._made[key] = BackendHandle(
                backend, self._manifest(backend, topology, model), topology, model
            )
        return self._made[key]

    def _manifest(self, backend: Backend, topology: Topology, model: str) -> dict[str, Any]:
        manifest = collect_manifest(
            topology=topology,
            backend_name=self.options.backend,
            backend_description=backend.describe(),
            model_name=model,
            protocol=self.options.protocol(),
            emulated=self.session.manifest["hardware"]["emulated"],
            devices_per_node=self.options.devices_per_node,
        )
        self.config.hook.pytest_afd_manifest(config=self.config, manifest=manifest)
        manifest["digest"] = manifest_digest(manifest)
        validate_manifest(manifest)
        return manifest

    def close(self) -> None:
        made, self._made = self._made, {}
        for handle in made.values():
            handle.backend.close()


# --- cases and measurements ----------------------------------------------------------------
@dataclass(frozen=True)
class StageCase:
    """One measured case: a workload, run settings and the cache phase it is measured in."""

    name: str  # unique within one measure() call; the result's case id suffix
    workload: Workload
    settings: RunSettings
    phase: str = PHASE_COLD
    labels: Mapping[str, Any] | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    notes: str | None = None
    # Where the case runs (None: the runner's backend); lets one schedule
    # interleave cases on different backends (Stage F: AFD vs PP layout).
    handle: BackendHandle | None = None

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"phase={self.phase!r}; expected one of {PHASES}")
        if self.phase == PHASE_STEADY and not self.settings.prefix_caching:
            raise ValueError(f"case {self.name!r}: the steady phase needs prefix_caching=True")


@dataclass
class MeasuredCase:
    """Measured repetitions of one case, its optional instrumented run and the written result."""

    case: StageCase
    runs: list[RunOutputs]
    instrumented: RunOutputs | None
    result: dict[str, Any]
    path: Path | None = None

    @property
    def throughput(self) -> float:
        """Median prefill tokens/s over the measured repetitions."""
        return float(self.result["metrics"][THROUGHPUT_METRIC]["stats"]["median"])

    @property
    def throughput_repetitions(self) -> list[float]:
        """Every measured repetition's prefill tokens/s (the dispersion a comparison must beat)."""
        return [float(v) for v in self.result["metrics"][THROUGHPUT_METRIC]["repetitions"]]

    @property
    def representative(self) -> RunOutputs:
        return self.runs[-1]

    @property
    def has_step_evidence(self) -> bool:
        return not is_absent(self.result["evidence"]["steps"])

    @property
    def has_expert_load(self) -> bool:
        return not is_absent(self.result["evidence"]["expert_load"])

    @property
    def max_imbalance(self) -> float | None:
        tokens = self.result["evidence"]["tokens"]
        return None if is_absent(tokens) else tokens["max_imbalance"]

    @property
    def realized_hit_ratio(self) -> float:
        return float(self.result["evidence"]["prefix_cache"]["realized_hit_ratio"])


def required_capabilities(settings: RunSettings) -> list[str]:
    """What a backend must declare to run ``settings`` as asked (no silent downgrade)."""
    needed = []
    if settings.split_policy != "none":
        needed.append(CAP_SPLIT)
    if settings.prefix_caching:
        needed.append(CAP_PREFIX_CACHE)
    if settings.chunk_size is not None:
        needed.append(CAP_CHUNKED_PREFILL)
    if settings.routing == "forced_balanced":
        needed.append(CAP_FORCED_ROUTING)
    if settings.quantization == "w8a8":
        needed.append(CAP_W8A8)
    return needed


def missing_capabilities(backend: Backend, settings: RunSettings) -> list[str]:
    return [cap for cap in required_capabilities(settings) if cap not in backend.capabilities]


def mean_step_time(run: RunOutputs) -> float:
    """Run wall time over forward steps: the step time without instrumenting anything."""
    if not run.steps:
        raise ValueError("the backend reported no forward steps for a run")
    return run.wall_time_s / len(run.steps)


def step_metrics(runs: Sequence[RunOutputs]) -> dict[str, Any]:
    """``step_time_s`` and ``forward_steps``, absent when the backend reports no steps."""
    if not all(run.steps for run in runs):
        missing = afd_result_docs.absent(NO_STEP_EVIDENCE)
        return {"step_time_s": missing, "forward_steps": missing}
    return {
        "step_time_s": afd_result_docs.measurement([mean_step_time(run) for run in runs], "s"),
        "forward_steps": len(runs[-1].steps),
    }


class StageRunner:
    """Build stage workloads and settings at the stage scale; measure cases; write results."""

    def __init__(
        self,
        *,
        handle: BackendHandle,
        options: Any,
        writer: Any,
        sizes: StageSizes,
        pool: BackendPool,
        progress: afd_progress.Emitter | None = None,
        title: str = "",
    ) -> None:
        self.handle = handle
        self.options = options
        self.writer = writer
        self.sizes = sizes
        self.pool = pool
        # Per-run progress lines (None: silent, e.g. under -q).
        self.progress = progress
        self.title = title

    @property
    def backend(self) -> Backend:
        return self.handle.backend

    @property
    def topology(self) -> Topology:
        return self.handle.topology

    def on(self, *, model_name: str | None = None, topology_spec: str | None = None) -> StageRunner:
        """The same runner on another model depth or topology (its own manifest)."""
        handle = self.pool.get(model_name=model_name, topology_spec=topology_spec)
        return StageRunner(
            handle=handle,
            options=self.options,
            writer=self.writer,
            sizes=self.sizes,
            pool=self.pool,
            progress=self.progress,
            title=self.title,
        )

    # ---- building blocks ------------------------------------------------------------
    def case(self, **fields: Any) -> StageCase:
        """A :class:`StageCase` on this runner's backend (test modules cannot import conftest)."""
        return StageCase(**{"handle": self.handle, **fields})

    def workload(self, distribution: str, **spec_fields: Any) -> Workload:
        fields = {
            "num_requests": LOGICAL_NUM_REQUESTS,
            "seed": self.options.seed,
            "target_total_tokens": LOGICAL_TOTAL_TOKENS,
            "scale": self.sizes.scale,
            "vocab_size": WORKLOAD_VOCAB_SIZE,
            "block_size": self.sizes.block_size,
            **spec_fields,
        }
        return make_workload(distribution, **fields)

    def settings(self, **overrides: Any) -> RunSettings:
        """Session settings (routing, topology's split constraints) at the stage scale.

        Measured runs are never instrumented and return no logits (headline
        numbers must not pay for either).
        """
        scaled = {
            "block_size": self.sizes.block_size,
            "max_num_batched_tokens": self.sizes.max_batched_tokens,
            "max_num_seqs": LOGICAL_NUM_REQUESTS,
            "return_logits": False,
            "instrument": False,
        }
        emulation = self.topology.cpu_emulation()
        constraints = {"split_align": emulation.split_align, "pcp_size": emulation.pcp_size}
        return self.options.run_settings(**{**scaled, **constraints, **overrides})

    def require(self, settings: RunSettings, handle: BackendHandle | None = None) -> None:
        """Skip (with the reason) when the backend cannot run ``settings``."""
        backend = (handle or self.handle).backend
        missing = missing_capabilities(backend, settings)
        if missing:
            pytest.skip(f"backend {backend.name!r} does not declare {missing} needed by {settings}")

    @staticmethod
    def require_evidence(measured: Mapping[str, MeasuredCase], kind: str) -> None:
        """Skip the evidence checks (results are already written) when a case lacks ``kind``.

        ``kind`` is ``"steps"`` (per-step split evidence) or ``"expert_load"``;
        a backend behind an HTTP API, for one, reports neither.
        """
        checks = {
            "steps": lambda item: item.has_step_evidence,
            "expert_load": lambda item: item.has_expert_load,
        }
        lacking = sorted(name for name, item in measured.items() if not checks[kind](item))
        if lacking:
            pytest.skip(
                f"results written; {kind} checks skipped: the backend reported no {kind} "
                f"for {lacking}"
            )

    def _handle(self, case: StageCase) -> BackendHandle:
        return case.handle or self.handle

    # ---- measuring ----------------------------------------------------------------------
    def _prepare(self, case: StageCase) -> None:
        """Put the prefix cache in the case's phase: every run starts from the same state."""
        backend = self._handle(case).backend
        if case.settings.prefix_caching:
            backend.reset_prefix_cache()
            if case.phase == PHASE_STEADY:
                seed_prompts = case.workload.prefix_warmup_prompts()
                if seed_prompts:
                    backend.run(seed_prompts, case.settings)

    def _run_once(self, case: StageCase, settings: RunSettings) -> RunOutputs:
        self._prepare(case)
        backend = self._handle(case).backend
        return afd_host.measured_run(lambda: backend.run(case.workload.prompts(), settings))

    def measure(
        self, cases: Sequence[StageCase], *, explain: bool = False, write: bool = True
    ) -> dict[str, MeasuredCase]:
        """Warm up, measure every case in one interleaved/random schedule, write one result each.

        ``explain`` (or ``--afd-profile``) adds one instrumented run per case,
        after the measured ones, when the backend declares instrumentation;
        its timings go to the evidence, never to the headline metrics.
        ``write=False`` leaves writing to :meth:`write` (a stage that adds
        cross-case evidence first).
        """
        names = [case.name for case in cases]
        if len(set(names)) != len(names):
            raise ValueError(f"case names must be unique within one measurement: {names}")
        for case in cases:
            self.require(case.settings, case.handle)
        warmups = self.options.warmups
        calls: dict[str, int] = dict.fromkeys(names, 0)
        measured: dict[str, list[RunOutputs]] = {name: [] for name in names}
        by_name = {case.name: case for case in cases}
        positions = {case.name: f"{i}/{len(cases)}" for i, case in enumerate(cases, start=1)}
        wanted = explain or self.options.profile
        progress = self._progress(cases, instrumented=wanted)

        def make_call(name: str) -> Callable[[], dict[str, float]]:
            def call() -> dict[str, float]:
                case = by_name[name]
                run = calls[name] + 1
                phase = "warmup" if run <= warmups else f"{run - warmups}/{self.options.repeats}"
                self._report_progress(progress, case, phase, positions[name])
                output = self._run_once(case, case.settings)
                calls[name] += 1
                # run_repeated runs each case's warmups before any measured run.
                if calls[name] > warmups:
                    measured[name].append(output)
                return {"wall_time_s": output.wall_time_s}

            return call

        repeated = self.options.repeat({name: make_call(name) for name in names})
        done = {}
        for case in cases:
            backend = self._handle(case).backend
            instrumented = None
            if wanted and CAP_INSTRUMENTATION in backend.capabilities:
                self._report_progress(progress, case, "instrumented", positions[case.name])
                instrumented = self._run_once(case, replace(case.settings, instrument=True))
            doc = self._result(case, measured[case.name], instrumented, repeated.protocol_json())
            if wanted and instrumented is None:
                doc["evidence"]["per_layer_timings"] = afd_result_docs.absent(
                    f"an instrumented run was asked for, but backend {backend.name!r} does not "
                    f"declare {CAP_INSTRUMENTATION!r}"
                )
            done[case.name] = MeasuredCase(case, measured[case.name], instrumented, doc)
        if write:
            self.write(done)
        progress.finish()
        return done

    def _progress(self, cases: Sequence[StageCase], *, instrumented: bool) -> afd_progress.Progress:
        """One step per backend run: warmups, measured repetitions, instrumented runs."""
        runs_per_case = self.options.warmups + self.options.repeats
        explained = sum(
            CAP_INSTRUMENTATION in self._handle(case).backend.capabilities for case in cases
        )
        total = len(cases) * runs_per_case + (explained if instrumented else 0)
        return afd_progress.Progress(total, self.progress, title=self.title, unit="run")

    @staticmethod
    def _report_progress(
        progress: afd_progress.Progress, case: StageCase, phase: str, position: str
    ) -> None:
        progress.step(
            case=f"{position} {case.name}",
            policy=case.settings.split_policy,
            workload=case.workload.name,
            rep=phase,
        )

    def write(self, measured: Mapping[str, MeasuredCase]) -> None:
        """Validate and write each case's result (one per case)."""
        for item in measured.values():
            item.path = self.writer.write(item.result)

    def record_omitted(
        self,
        *,
        name: str,
        workload: Workload,
        settings: RunSettings,
        reason: str,
        evidence: Mapping[str, Any],
    ) -> dict[str, Any]:
        """Write the result of a case ruled out before running (e.g. an invalid chunk size).

        Its settings, workload and the reason are recorded; every measurement
        is absent with that reason, so reports can mark it instead of dropping it.
        """
        not_run = afd_result_docs.absent(f"omitted, not measured: {reason}")
        metrics = afd_result_docs.metrics_json(
            completed_requests=not_run,
            failed_requests=not_run,
            prefill_tokens_per_s=not_run,
            request_throughput=not_run,
            ttft_s=not_run,
            peak_memory_bytes=not_run,
        )
        evidence_doc = dict.fromkeys(
            ("steps", "tokens", "prefix_cache", "per_layer_timings", "expert_load"), not_run
        )
        settings_doc = afd_result_docs.settings_json(settings)
        settings_doc["stage_sizes"] = self.sizes.to_json()
        doc = self.writer.build(
            case_suffix=name,
            settings=settings_doc,
            manifest=self.handle.manifest,
            workload=self.workload_doc(workload),
            metrics=metrics,
            evidence={**evidence_doc, **evidence},
            notes=f"omitted: {reason}",
        )
        self.writer.write(doc)
        return doc

    def _result(
        self,
        case: StageCase,
        runs: list[RunOutputs],
        instrumented: RunOutputs | None,
        protocol: dict[str, Any],
    ) -> dict[str, Any]:
        metrics = {**afd_result_docs.metrics_from_runs(runs), **step_metrics(runs)}
        evidence = afd_result_docs.evidence_from_outputs(
            runs[-1],
            routing=case.settings.routing,
            num_ep_ranks=self._handle(case).topology.num_ep_ranks,
            requested_hit_ratio=case.workload.spec.requested_hit_ratio
            if case.settings.prefix_caching
            else None,
            **case.evidence,
        )
        if not runs[-1].steps:
            # Empty steps would read as zero scheduled tokens: say they are unknown.
            evidence["steps"] = evidence["tokens"] = afd_result_docs.absent(NO_STEP_EVIDENCE)
        evidence["prefix_cache"]["phase"] = case.phase
        evidence["prefix_cache"]["designed_hit_ratio"] = case.workload.designed_hit_ratio
        if instrumented is not None:
            evidence["per_layer_timings"] = instrumented.timings or afd_result_docs.absent(
                "the instrumented run reported no timings"
            )
            evidence["instrumented_steps"] = [dict(step) for step in instrumented.steps]
            evidence["profiler_overhead"] = (
                instrumented.wall_time_s / summarize([run.wall_time_s for run in runs]).median
            )
        settings_doc = afd_result_docs.settings_json(case.settings)
        settings_doc["prefix_cache"]["phase"] = case.phase
        settings_doc["stage_sizes"] = self.sizes.to_json()
        samples = afd_host.samples_of(runs)
        return self.writer.build(
            case_suffix=case.name,
            settings=settings_doc,
            manifest=self._handle(case).manifest,
            workload=self.workload_doc(case.workload),
            protocol=protocol,
            host=None if samples is None else afd_host.host_json(samples),
            metrics=metrics,
            evidence=evidence,
            labels=case.labels,
            notes=case.notes,
        )

    @staticmethod
    def workload_doc(workload: Workload) -> dict[str, Any]:
        description = workload.describe()
        return afd_result_docs.workload_json(
            dataset_name=workload.name,
            prompt_lengths=workload.prompt_lengths,
            seed=workload.spec.seed,
            dataset_digest=workload.content_hash,
            arrival_process=workload.spec.arrival,
            stats=description["stats"],
            spec=description["spec"],
            shared_prefix_tokens=workload.shared_prefix_tokens,
            designed_hit_ratio=workload.designed_hit_ratio,
            source=description["source"],
        )


# --- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def stage_sizes(pytestconfig: pytest.Config, afd_options) -> StageSizes:
    """The stage scale and the recipe sizes at that scale."""
    return StageSizes(stage_scale(pytestconfig, afd_options.backend))


@pytest.fixture(scope="session")
def backend_pool(pytestconfig: pytest.Config, afd_backend, afd_manifest, afd_options, npu_topology):
    """The session backend plus backends for other models/topologies (closed at the end)."""
    pool = BackendPool(
        pytestconfig, BackendHandle(afd_backend, afd_manifest, npu_topology, afd_options.model)
    )
    yield pool
    pool.close()


@pytest.fixture
def stage_runner(request, backend_pool, afd_options, afd_results, stage_sizes) -> StageRunner:
    """The stage measurement protocol bound to this test's result writer and progress lines."""
    return StageRunner(
        handle=backend_pool.session,
        options=afd_options,
        writer=afd_results,
        sizes=stage_sizes,
        pool=backend_pool,
        progress=afd_progress.pytest_emitter(request.config),
        title=request.node.name,
    )


@pytest.fixture(scope="session")
def stage_helpers() -> SimpleNamespace:
    """This module's classes and pure helpers, for tests (conftest modules are not importable)."""
    return SimpleNamespace(
        BackendHandle=BackendHandle,
        StageCase=StageCase,
        StageRunner=StageRunner,
        StageSizes=StageSizes,
        mean_step_time=mean_step_time,
        missing_capabilities=missing_capabilities,
        parse_scale=parse_scale,
        power_of_two_at_most=power_of_two_at_most,
        required_capabilities=required_capabilities,
    )


# --- the report at the end of a stage run --------------------------------------------------
_REPORT_KEY = pytest.StashKey[Path]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Render the report when this session wrote stage results (controller only under xdist)."""
    config = session.config
    if hasattr(config, "workerinput"):
        return
    state = afd_session(config)
    if not any(entry["case_kind"] in STAGE_KINDS for entry in state.written):
        return
    from pytest_afd.report import render  # matplotlib only when a report is due

    config.stash[_REPORT_KEY] = render(state.options.results_dir)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    report = config.stash.get(_REPORT_KEY, None)
    if report is not None:
        terminalreporter.write_line(f"pytest-afd stage report: {report}")
