"""The result JSON of stage cases (measured and omitted): the :class:`StageRunner` half that
builds and writes results from a runner's ``writer``, ``sizes`` and backend handles."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stage_cases import (
    NO_PROFILE_REASON,
    NO_STEP_EVIDENCE,
    MeasuredCase,
    StageCase,
    step_metrics,
)

from pytest_afd.core.backend import (
    RunOutputs,
    RunSettings,
)
from pytest_afd.profiling.evidence import with_overhead
from pytest_afd.results import documents as afd_result_docs
from pytest_afd.results.parts import timings_or_absent
from pytest_afd.results.stand_in import with_served_facts
from pytest_afd.stats import host as afd_host
from pytest_afd.stats.repetitions import summarize
from pytest_afd.workloads import Workload


class StageResults:
    """Result building and writing for :class:`stage_runner.StageRunner` (a mixin)."""

    def write(self, measured: Mapping[str, MeasuredCase]) -> None:
        """Validate and write each case's result (one per case; an A/B alias once)."""
        written: set[int] = set()
        for item in measured.values():
            if id(item) not in written:
                written.add(id(item))
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
            manifest=with_served_facts(self.handle.manifest, self.handle.backend),
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
            evidence["steps"] = evidence["tokens"] = afd_result_docs.absent(
                runs[-1].steps_absent_reason or NO_STEP_EVIDENCE)
        evidence["prefix_cache"]["phase"] = case.phase
        evidence["prefix_cache"]["designed_hit_ratio"] = case.workload.designed_hit_ratio
        if instrumented is not None:
            evidence["per_layer_timings"] = timings_or_absent(
                instrumented.timings, "the instrumented run reported no timings")
            evidence["instrumented_steps"] = [dict(step) for step in instrumented.steps]
            evidence["profiler_overhead"] = (
                instrumented.wall_time_s / summarize([run.wall_time_s for run in runs]).median
            )
            # The instrumented run's trace evidence (docs/profiling.md), with its overhead.
            evidence["profile"] = with_overhead(
                instrumented.profile, instrumented.wall_time_s, [run.wall_time_s for run in runs]
            ) if instrumented.profile else afd_result_docs.absent(
                instrumented.profile_absent_reason or NO_PROFILE_REASON)
        settings_doc = afd_result_docs.settings_json(case.settings)
        settings_doc["prefix_cache"]["phase"] = case.phase
        settings_doc["stage_sizes"] = self.sizes.to_json()
        samples = afd_host.samples_of(runs)
        return self.writer.build(
            case_suffix=case.name,
            settings=settings_doc,
            manifest=with_served_facts(self._handle(case).manifest, self._handle(case).backend),
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
            # Both distributions: whole prompts (prompt_lengths) and what a warm cache
            # leaves to compute; hit-ratio twins share the first, differ in this one.
            uncached_prompt_lengths=afd_result_docs.prompt_length_summary(
                workload.uncached_lengths),
            source=description["source"],
        )
