"""The stage measurement protocol (warmups, interleaved repetitions, instrumented runs).

Every stage measures the same way (the RFC's "reproducible benchmark harness"):
``warmups`` discarded runs per case, then ``>= 3`` measured repetitions in the
session's run order, headline metrics only from non-instrumented runs, and one
extra instrumented run per case only to explain (never for headline numbers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest
from stage_backends import BackendHandle, BackendPool
from stage_cases import (
    PHASE_STEADY,
    MeasuredCase,
    StageCase,
    missing_capabilities,
)
from stage_results import StageResults
from stage_sizes import (
    LOGICAL_NUM_REQUESTS,
    LOGICAL_TOTAL_TOKENS,
    WORKLOAD_VOCAB_SIZE,
    StageSizes,
)

from pytest_afd.core.backend import (
    CAP_INSTRUMENTATION,
    Backend,
    RunOutputs,
    RunSettings,
)
from pytest_afd.results import documents as afd_result_docs
from pytest_afd.run import ab as afd_ab
from pytest_afd.run import ab_sides as afd_ab_sides
from pytest_afd.run import progress as afd_progress
from pytest_afd.stats import host as afd_host
from pytest_afd.stats import sequential_run as afd_sequential
from pytest_afd.topology.spec import Topology
from pytest_afd.workloads import Workload, make_workload


def stage_settings(options: Any, sizes: StageSizes, topology: Topology, **overrides: Any) -> RunSettings:
    """Session settings (routing, the topology's split constraints) at the stage scale.

    Measured runs are never instrumented and return no logits (headline
    numbers must not pay for either). One function for the runner and for the
    deployments a stage test declares (``afd_deployments``), so they agree.
    """
    scaled = {
        "block_size": sizes.block_size,
        "max_num_batched_tokens": sizes.max_batched_tokens,
        "max_num_seqs": LOGICAL_NUM_REQUESTS,
        "return_logits": False,
        "instrument": False,
    }
    emulation = topology.cpu_emulation()
    constraints = {"split_align": emulation.split_align, "pcp_size": emulation.pcp_size}
    return options.run_settings(**{**scaled, **constraints, **overrides})
def ab_cases(cases: Sequence[StageCase], ab: tuple[dict[str, Any], dict[str, Any]],
             handle_for: Callable[[str, BackendHandle | None], BackendHandle] | None = None,
             ) -> list[StageCase]:
    """Each case twice, ``<name>/ab-A`` and ``<name>/ab-B``, adjacent: the interleaved order
    then alternates A and B repetition by repetition. ``handle_for(side, handle)``: each
    side's own backend (two deployments or code versions, pytest_afd.run.ab_sides)."""
    return [replace(case, name=f"{case.name}/{side}",
                    settings=afd_ab.side_settings(case.settings, overrides),
                    handle=case.handle if handle_for is None else handle_for(side, case.handle))
            for case in cases for side, overrides in zip(afd_ab.SIDES, ab, strict=True)]


class StageRunner(StageResults):
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
        ab: tuple[dict[str, Any], dict[str, Any]] | None = None,
        ab_sides: afd_ab_sides.AbSides | None = None,
    ) -> None:
        self.handle = handle
        self.options = options
        self.writer = writer
        self.sizes = sizes
        self.pool = pool
        # Per-run progress lines (None: silent, e.g. under -q).
        self.progress = progress
        self.title = title
        # --afd-ab: each case measured with option set A and with B, interleaved (pytest_afd.run.ab).
        self.ab = ab
        # --afd-ab-url / --afd-ab-python / --afd-ab-checkout: each side its own backend.
        self.ab_sides = ab_sides

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
            ab=self.ab,
            ab_sides=self.ab_sides,
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
        """:func:`stage_settings` on this runner's topology."""
        return stage_settings(self.options, self.sizes, self.topology, **overrides)

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
        self, cases: Sequence[StageCase], *, explain: bool = False, write: bool = True,
        comparisons: Sequence[tuple[str, str]] | None = None,
    ) -> dict[str, MeasuredCase]:
        """Warm up, measure every case in one interleaved/random schedule, write one result each.

        ``explain`` (or ``--afd-profile``) adds one instrumented run per case,
        after the measured ones, when the backend declares instrumentation;
        its timings go to the evidence, never to the headline metrics.
        ``write=False`` leaves writing to :meth:`write` (a stage that adds
        cross-case evidence first). Under ``--afd-sequential`` each comparison
        (``comparisons``, default :func:`default_comparisons`) is measured until
        decided (``pytest_afd.stats.sequential_run``); otherwise every case gets
        exactly ``--afd-repeats``.
        """
        originals = [case.name for case in cases]
        if self.ab is not None:
            cases = ab_cases(cases, self.ab, None if self.ab_sides is None else self._side_handle)
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
                phase = "warmup" if run <= warmups else f"{run - warmups}/{planned}"
                self._report_progress(progress, case, phase, positions[name])
                output = self._run_once(case, case.settings)
                calls[name] += 1
                # run_repeated runs each case's warmups before any measured run.
                if calls[name] > warmups:
                    measured[name].append(output)
                return {"wall_time_s": output.wall_time_s}

            return call

        planned = f"<={self.options.max_repeats}" if self.options.sequential else self.options.repeats
        repeated = self._repeat({name: make_call(name) for name in names}, cases, comparisons)
        done = {}
        for case in cases:
            backend = self._handle(case).backend
            instrumented = None
            if wanted and CAP_INSTRUMENTATION in backend.capabilities:
                self._report_progress(progress, case, "instrumented", positions[case.name])
                instrumented = self._run_once(case, replace(case.settings, instrument=True))
            protocol = (repeated.protocol_json(case.name) if self.options.sequential
                        else repeated.protocol_json())
            doc = self._result(self._with_side(case), measured[case.name], instrumented, protocol)
            if wanted and instrumented is None:
                doc["evidence"]["per_layer_timings"] = afd_result_docs.absent(
                    f"an instrumented run was asked for, but backend {backend.name!r} does not "
                    f"declare {CAP_INSTRUMENTATION!r}"
                )
            done[case.name] = MeasuredCase(case, measured[case.name], instrumented, doc)
        if write:
            self.write(done)
        progress.finish()
        if self.ab is not None:  # the stage's own checks read side A under the case's name
            for name in originals:
                done.setdefault(name, done[f"{name}/{afd_ab.SIDES[0]}"])
        return done

    def _side_handle(self, side: str, handle: BackendHandle | None) -> BackendHandle:
        return self.pool.side(side, handle or self.handle)

    def _with_side(self, case: StageCase) -> StageCase:
        """Under two deployments or code versions: the result's ``evidence.ab_side`` says which
        side it is, as given and as the serving deployment reported after its runs."""
        if self.ab_sides is None:
            return case
        side = self.ab_sides.side(case.name.rpartition("/")[2])
        record = afd_ab_sides.side_evidence(side, self._handle(case).backend)
        return replace(case, evidence={**case.evidence, "ab_side": record})

    def _repeat(self, calls: dict[str, Callable[[], dict[str, float]]],
                cases: Sequence[StageCase], comparisons: Sequence[tuple[str, str]] | None):
        """Fixed repetitions (the default), or sequential ones per comparison."""
        if not self.options.sequential:
            return self.options.repeat(calls)
        if comparisons is None:
            comparisons = afd_sequential.default_comparisons(
                cases, afd_ab.SIDES if self.ab is not None else None)
        return afd_sequential.run_sequential(
            calls, comparisons, design=self.options.sequential_design(),
            warmups=self.options.warmups, run_order=self.options.run_order,
            seed=self.options.seed)

    def _progress(self, cases: Sequence[StageCase], *, instrumented: bool) -> afd_progress.Progress:
        """One step per backend run: warmups, measured repetitions (sequential: at most
        the maximum), instrumented runs."""
        measured = self.options.max_repeats if self.options.sequential else self.options.repeats
        runs_per_case = self.options.warmups + measured
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
