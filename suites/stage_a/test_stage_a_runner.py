"""The shared stage protocol (suites/conftest.py), on a scripted backend.

Warmups are discarded, every case gets the measured repetitions in one
interleaved schedule, the cache phase is re-established before every run,
instrumented runs never feed headline metrics, and a missing capability skips.
"""

from __future__ import annotations

import pytest
from scripted_backend import INSTRUMENTED_WALL_S, MEASURED_WALL_S

from pytest_afd.core.backend import (
    CAP_INSTRUMENTATION,
    CAP_PREFIX_CACHE,
    CAP_SPLIT,
    RunSettings,
)
from pytest_afd.workloads import make_workload


def _cases(runner, **settings):
    workload = runner.workload("uniform", requested_hit_ratio=0.5)
    return [
        runner.case(name=name, workload=workload, settings=runner.settings(**settings), phase=phase)
        for name, phase in (("cold", "cold"), ("steady", "steady"))
    ]


def test_stage_runner_discards_warmups_and_interleaves(make_runner):
    runner, backend = make_runner({CAP_SPLIT, CAP_PREFIX_CACHE})
    measured = runner.measure(_cases(runner, prefix_caching=True))
    assert {name: len(item.runs) for name, item in measured.items()} == {"cold": 3, "steady": 3}
    protocol = measured["cold"].result["protocol"]
    assert protocol["executed_order"] == [f"{c}#{r}" for r in range(3) for c in ("cold", "steady")]
    assert protocol["warmups"] == 1 and protocol["repetitions"] == 3
    workload_runs = [c for c in backend.calls if c == ("run", (8, False))]
    assert len(workload_runs) == 2 * (1 + 3)
    assert len(runner.writer.docs) == 2
    metrics = measured["cold"].result["metrics"]
    assert (
        metrics["prefill_tokens_per_s"]["repetitions"]
        == [measured["cold"].case.workload.total_tokens / MEASURED_WALL_S] * 3
    )
    assert metrics["step_time_s"]["stats"]["median"] == MEASURED_WALL_S


def test_stage_runner_sets_the_cache_phase_before_every_run(make_runner):
    runner, backend = make_runner({CAP_SPLIT, CAP_PREFIX_CACHE})
    runner.measure(_cases(runner, prefix_caching=True), write=False)
    # Each run is preceded by a reset; a steady run also by the one-prompt prefix seed.
    seeds = [i for i, call in enumerate(backend.calls) if call == ("run", (1, False))]
    assert len(seeds) == 1 + 3  # the steady case's warmup and measured runs
    for index in seeds:
        assert backend.calls[index - 1] == ("reset", None)
    resets = sum(call[0] == "reset" for call in backend.calls)
    assert resets == 2 * (1 + 3)


def test_stage_runner_instrumented_run_only_explains(make_runner):
    runner, backend = make_runner({CAP_SPLIT, CAP_INSTRUMENTATION})
    workload = make_workload("bimodal", seed=0, scale=1 / 64, vocab_size=64)
    case = runner.case(name="c", workload=workload, settings=runner.settings())
    measured = runner.measure([case], explain=True)["c"]
    assert backend.calls.count(("run", (8, True))) == 1
    evidence = measured.result["evidence"]
    assert evidence["per_layer_timings"] == {"layers": [{"attention": 0.1}]}
    assert evidence["profiler_overhead"] == INSTRUMENTED_WALL_S / MEASURED_WALL_S
    walls = measured.result["metrics"]["request_throughput"]["repetitions"]
    assert walls == [8 / MEASURED_WALL_S] * 3  # no instrumented number in the headline


def test_stage_runner_skips_when_a_capability_is_missing(make_runner):
    runner, _ = make_runner({CAP_SPLIT})
    with pytest.raises(pytest.skip.Exception, match="prefix_cache"):
        runner.measure(_cases(runner, prefix_caching=True))


def test_stage_runner_rejects_duplicate_case_names(make_runner):
    runner, _ = make_runner({CAP_SPLIT, CAP_PREFIX_CACHE})
    case = _cases(runner, prefix_caching=True)[0]
    with pytest.raises(ValueError, match="unique"):
        runner.measure([case, case])


def test_stage_case_steady_phase_needs_prefix_caching(stage_helpers):
    workload = make_workload("uniform", scale=1 / 64, vocab_size=64)
    with pytest.raises(ValueError, match="prefix_caching=True"):
        stage_helpers.StageCase(name="x", workload=workload, settings=RunSettings(), phase="steady")
    with pytest.raises(ValueError, match="phase='warm'"):
        stage_helpers.StageCase(name="x", workload=workload, settings=RunSettings(), phase="warm")


def test_stage_sizes_scale_the_recipe(stage_helpers):
    sizes = stage_helpers.StageSizes(1 / 64)
    assert (sizes.block_size, sizes.max_batched_tokens, sizes.tokens(8192)) == (2, 2188, 128)
    assert stage_helpers.StageSizes(1.0).block_size == 128
    assert stage_helpers.StageSizes(1 / 100).block_size == 1
    assert stage_helpers.power_of_two_at_most(96) == 64


def test_stage_scale_parsing(stage_helpers):
    assert stage_helpers.parse_scale("1/64", "x") == 1 / 64
    assert stage_helpers.parse_scale("0.5", "x") == 0.5
    for bad in ("0", "2", "a/b", "1/0", "nan"):
        with pytest.raises(pytest.UsageError, match=repr(bad)):
            stage_helpers.parse_scale(bad, "--afd-stage-scale")


def test_stage_required_capabilities(stage_helpers):
    settings = RunSettings(
        split_policy="none", prefix_caching=True, chunk_size=64, routing="forced_balanced"
    )
    assert stage_helpers.required_capabilities(settings) == [
        "prefix_cache",
        "chunked_prefill",
        "forced_routing",
    ]
    assert stage_helpers.required_capabilities(RunSettings(quantization="w8a8")) == [
        "split",
        "w8a8",
    ]


def test_stage_runner_records_an_omitted_case_with_its_reason(make_runner):
    runner, backend = make_runner({CAP_SPLIT})
    workload = runner.workload("bimodal")
    doc = runner.record_omitted(
        name="chunk100",
        workload=workload,
        settings=runner.settings(chunk_size=100),
        reason="chunk 100 is not a multiple of page size 16",
        evidence={"chunk_plan": {"valid": False, "reasons": ["not a multiple"]}},
    )
    assert backend.calls == []  # nothing ran
    assert runner.writer.docs == [doc]  # validated against the schema
    reason = doc["metrics"]["prefill_tokens_per_s"]["absent_reason"]
    assert reason == "omitted, not measured: chunk 100 is not a multiple of page size 16"
    assert doc["evidence"]["chunk_plan"]["valid"] is False
    assert doc["settings"]["chunked_prefill"] == {"enabled": True, "chunk_size": 100}


def test_stage_runner_marks_missing_step_evidence_absent(make_runner):
    runner, _ = make_runner({CAP_SPLIT}, report_steps=False)
    workload = runner.workload("bimodal")
    measured = runner.measure(
        [runner.case(name="c", workload=workload, settings=runner.settings())]
    )
    result = measured["c"].result
    assert result["metrics"]["step_time_s"]["absent_reason"] == (
        "the backend reported no per-step split evidence"
    )
    assert result["evidence"]["tokens"]["value"] is None  # not "0 tokens scheduled"
    assert measured["c"].max_imbalance is None and not measured["c"].has_step_evidence
    with pytest.raises(pytest.skip.Exception, match="steps checks skipped"):
        runner.require_evidence(measured, "steps")
    runner_with_steps, _ = make_runner({CAP_SPLIT})
    with_steps = runner_with_steps.measure(
        [runner_with_steps.case(name="c", workload=workload, settings=runner.settings())]
    )
    runner.require_evidence(with_steps, "steps")  # no skip


def test_backend_pool_gives_another_topology_its_own_backend_and_manifest(backend_pool):
    session = backend_pool.session
    assert backend_pool.get() is session
    assert backend_pool.get(model_name=session.model_name) is session
    spec = next(s for s in ("dp4pcp8", "pp4pcp8") if s != session.topology.canonical)
    other = backend_pool.get(topology_spec=spec)
    assert other is not session and other.backend is not session.backend
    assert other.manifest["topology"]["canonical"] == spec
    assert other.manifest["digest"] != session.manifest["digest"]
    assert backend_pool.get(topology_spec=spec) is other  # made once per session


def test_stage_runner_says_why_there_is_no_instrumented_run(make_runner):
    runner, backend = make_runner({CAP_SPLIT}, profile=True)
    workload = make_workload("bimodal", seed=0, scale=1 / 64, vocab_size=64)
    measured = runner.measure(
        [runner.case(name="c", workload=workload, settings=runner.settings())]
    )
    assert all(not instrument for _, (_, instrument) in backend.calls)
    reason = measured["c"].result["evidence"]["per_layer_timings"]["absent_reason"]
    assert "does not declare 'instrumentation'" in reason


def test_stage_runner_reports_progress_per_run(make_runner):
    runner, _ = make_runner({CAP_SPLIT, CAP_PREFIX_CACHE, CAP_INSTRUMENTATION})
    lines = []
    runner.progress, runner.title = lines.append, "test_x"
    runner.measure(_cases(runner, prefix_caching=True), explain=True, write=False)
    total = 2 * (1 + 3) + 2  # warmup + repetitions per case, one instrumented run each
    assert len(lines) == total + 1
    assert lines[0].startswith(
        f"test_x run 1/{total} case=1/2 cold policy=token_balanced workload=uniform"
    )
    assert " rep=warmup elapsed " in lines[0]
    assert any(
        f"run {total}/{total} case=2/2 steady" in line and "rep=instrumented" in line
        for line in lines
    )
    assert any("case=2/2 steady" in line and "rep=3/3" in line for line in lines)
    assert lines[-1].startswith(f"test_x {total}/{total} runs done in ")


class _PolicyTimedBackend:
    """The scripted backend with seeded, policy-dependent wall times (sequential runs)."""

    def __init__(self, backend, factors, seed=0):
        import numpy as np

        self.inner, self.factors, self.rng = backend, factors, np.random.default_rng(seed)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, prompts, settings):
        outputs = self.inner.run(prompts, settings)
        noise = float(self.rng.normal(0.0, 0.05))
        outputs.wall_time_s = MEASURED_WALL_S * self.factors[settings.split_policy] * (1 + noise)
        return outputs


def test_sequential_measures_each_comparison_until_decided_and_records_why(make_runner):
    runner, backend = make_runner({CAP_SPLIT}, sequential=True, max_repeats=16)
    timed = _PolicyTimedBackend(backend, {"none": 1.0, "token_balanced": 1.5,
                                          "request_boundary": 1.0}, seed=4)
    runner.handle.backend = timed
    workload = runner.workload("uniform")
    cases = [runner.case(name=policy, workload=workload,
                         settings=runner.settings(split_policy=policy))
             for policy in ("none", "token_balanced", "request_boundary")]
    measured = runner.measure(cases)
    slower = measured["token_balanced"].result["protocol"]
    decided = slower["sequential"]["comparisons"]
    assert [(c["a"], c["b"], c["stopped"], c["verdict"]) for c in decided] == [
        ("none", "token_balanced", "excludes_threshold", "higher")]
    assert slower["repetitions"] == decided[0]["repetitions"] == len(measured["token_balanced"].runs)
    same = measured["request_boundary"].result["protocol"]["sequential"]["comparisons"][0]
    assert same["stopped"] in ("equivalent", "max_repetitions") and same["verdict"] != "higher"
    reference = measured["none"].result["protocol"]
    assert reference["repetitions"] == max(len(item.runs) for item in measured.values())
    assert len(reference["sequential"]["comparisons"]) == 2
    assert len(runner.writer.docs) == 3  # every document schema-valid (CollectingWriter)
