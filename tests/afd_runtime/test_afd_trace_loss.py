"""A lost profile names its cause (issue 45): real instrumented AFD steps whose trace writing
or traces are broken on purpose, then ``cpu_run.finish`` (the CPU backend's analysis)."""

from __future__ import annotations

import pytest

from pytest_afd.core.backend import RunOutputs, RunSettings
from pytest_afd.profiling import cpu_run
from tests.support.afd_runtime_helpers import make_batch, plan_for

pytest.importorskip("msprof_analyze", reason="msprof-analyze not installed (extra [profile])")

LENGTHS = [40, 24]
INSTRUMENTED = RunSettings(instrument=True)


@pytest.fixture(scope="module")
def runtime(afd_config):
    from pytest_afd.backends.cpu.afd import AfdRuntime
    from tests.support.afd_runtime_helpers import SEED, THREADS_PER_RANK

    runtime = AfdRuntime(afd_config, SEED, num_attention=1, num_ffn=2,
                         threads_per_rank=THREADS_PER_RANK)
    yield runtime
    runtime.close()


@pytest.fixture(autouse=True)
def kept_traces(monkeypatch, tmp_path):
    """Trace roots under the test's tmp dir, kept (finish must not remove what a test reads)."""
    monkeypatch.setenv(cpu_run.ENV_KEEP_TRACES, str(tmp_path / "kept"))


def instrumented_run(runtime, afd_config, steps=1, before_steps=None):
    """``steps`` instrumented steps into a fresh trace root; ``before_steps(root)`` may
    break the root first."""
    run = cpu_run.start(runtime, INSTRUMENTED)
    assert run.keep
    if before_steps is not None:
        before_steps(run.root)
    ids, metadata = make_batch(afd_config, LENGTHS, seed=3)
    plan = plan_for(metadata, "token_balanced")
    for _ in range(steps):
        runtime.run_forward(ids, metadata, plan, instrument=True)
    return run


def finish(run):
    return cpu_run.finish(run, RunOutputs(requests=[]))


def test_a_healthy_run_has_its_profile(runtime, afd_config):
    outputs = finish(instrumented_run(runtime, afd_config))
    assert outputs.profile is not None and outputs.profile_absent_reason is None


def test_an_unwritable_trace_directory_is_named_and_the_step_still_runs(runtime, afd_config,
                                                                        tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")

    def unwritable(root):
        runtime.trace_dir = str(blocker / "traces")  # every rank's mkdir fails

    run = instrumented_run(runtime, afd_config, before_steps=unwritable)
    outputs = finish(run)
    assert outputs.profile is None
    reason = outputs.profile_absent_reason
    assert reason.startswith("trace writing failed on 3 rank-step(s)"), reason
    assert "attention rank 0" in reason and "ffn rank 1" in reason and "Not a directory" in reason


def test_a_rank_that_writes_no_trace_is_named(runtime, afd_config):
    def block_ffn_rank1(root):
        (root / "ffn").mkdir(parents=True)
        (root / "ffn" / "rank1").write_text("a file where the rank's directory goes")

    outputs = finish(instrumented_run(runtime, afd_config, before_steps=block_ffn_rank1))
    assert outputs.profile is None
    reason = outputs.profile_absent_reason
    assert "trace writing failed on 1 rank-step(s): ffn rank 1 could not write" in reason, reason
    assert "attention rank 0" not in reason


def test_a_missing_step_file_is_named(runtime, afd_config):
    run = instrumented_run(runtime, afd_config, steps=2)
    first = min((run.root / "ffn" / "rank0").iterdir())
    first.unlink()  # as a cleanup racing the analysis would
    outputs = finish(run)
    assert outputs.profile is None
    step = first.name.split(".")[0].removeprefix("step")
    assert f"a rank's trace file is missing: ffn rank 0 (step {step})" in \
        outputs.profile_absent_reason


def test_a_truncated_trace_is_named(runtime, afd_config):
    run = instrumented_run(runtime, afd_config)
    (path,) = (run.root / "attention" / "rank0").iterdir()
    path.write_bytes(b"")
    outputs = finish(run)
    assert outputs.profile is None
    assert outputs.profile_absent_reason.startswith("truncated trace file(s) of 0 bytes: "
                                                    "attention/rank0/step")


def test_a_trace_that_does_not_parse_is_named_with_the_parser_error(runtime, afd_config):
    run = instrumented_run(runtime, afd_config)
    (path,) = (run.root / "ffn" / "rank1").iterdir()
    path.write_text('{"traceEvents": [')  # cut off mid-write
    outputs = finish(run)
    assert outputs.profile is None
    reason = outputs.profile_absent_reason
    assert reason.startswith("the trace analysis raised ValueError: parse error in trace"), reason
    assert str(path) in reason


def test_traces_removed_before_the_analysis_are_named(runtime, afd_config):
    import shutil

    run = instrumented_run(runtime, afd_config)
    shutil.rmtree(run.root)
    outputs = finish(run)
    assert outputs.profile is None
    assert "was gone when the analysis began" in outputs.profile_absent_reason


def test_no_trace_written_at_all_is_named(runtime, afd_config, monkeypatch):
    monkeypatch.delenv(cpu_run.ENV_KEEP_TRACES)
    run = cpu_run.start(runtime, INSTRUMENTED)  # the run's root, but no instrumented step
    outputs = finish(run)
    assert outputs.profile is None
    assert outputs.profile_absent_reason.startswith("no trace files were written under")
    assert not run.root.exists()  # not kept: removed after the analysis
