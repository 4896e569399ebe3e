"""The plugin profiler's schedule and variables, the profiled backend fed fixture traces,
and npu-smi device metrics from a stand-in on PATH."""

from __future__ import annotations

import os
import shutil
import stat
import textwrap
from pathlib import Path

import pytest

from pytest_afd.backends.vllm_ascend.launch import LaunchOptions, build_launch_plan, main
from pytest_afd.core.backend import CAP_INSTRUMENTATION, PromptRequest, RunOutputs, RunSettings
from pytest_afd.profiling import device_metrics, evidence, schedule
from pytest_afd.profiling.backend import ProfiledBackend

DATA = Path(__file__).with_name("data")
PROMPTS = [PromptRequest("r0", (1, 2, 3))]


def test_schedule_records_exactly_the_measured_steps():
    chosen = schedule.schedule_for(prior_steps=7, warmup_steps=3, measured_steps=4)
    assert chosen.to_json() == {"skip_first": 7, "wait": 2, "warmup": 1, "active": 4, "repeat": 1}
    # torch's schedule: skip_first, then wait (off), warmup (traced, dropped), active (kept).
    recorded = [step for step in range(20)
                if step >= chosen.skip_first + chosen.wait + chosen.warmup
                and step < chosen.skip_first + chosen.wait + chosen.warmup + chosen.active]
    assert recorded == [10, 11, 12, 13]  # 7 earlier + 3 warm-ups, then the 4 measured
    assert schedule.schedule_for(prior_steps=0, warmup_steps=0, measured_steps=1).warmup == 0
    with pytest.raises(ValueError, match="measured_steps=0"):
        schedule.schedule_for(prior_steps=0, warmup_steps=1, measured_steps=0)


def test_env_round_trips_through_the_plugin_reading():
    chosen = schedule.schedule_for(prior_steps=2, warmup_steps=2, measured_steps=3)
    env = schedule.profiler_env("ffn", chosen, "/traces/ffn")
    assert env["AFD_NPU_FFN_PROFILER_DIR"] == "/traces/ffn"
    assert set(env) == {f"AFD_NPU_FFN_PROFILER_{name}" for name in schedule.FIELDS}
    assert schedule.read_schedule("ffn", env) == chosen
    assert schedule.read_schedule("attention", env) is None  # not switched on
    # The plugin's defaults when only ENABLE is set (SKIP_FIRST 1500).
    assert schedule.read_schedule("attention", {"AFD_NPU_ATTENTION_PROFILER_ENABLE": "1"}
                                  ).skip_first == 1500
    with pytest.raises(ValueError, match="AFD_NPU_FFN_PROFILER_WAIT='x'"):
        schedule.read_schedule("ffn", {**env, "AFD_NPU_FFN_PROFILER_WAIT": "x"})


def test_plan_gets_each_roles_variables():
    plan = build_launch_plan("dp1-ep1", LaunchOptions(model="/m", node_addresses=("127.0.0.1",),
                                                      api_key_env=None))
    chosen = schedule.schedule_for(prior_steps=0, warmup_steps=1, measured_steps=2)
    profiled = schedule.apply_to_plan(plan, chosen, "/t")
    for process in profiled.processes:
        env = dict(process.env)
        assert env[f"{schedule.ENV_PREFIX[process.role]}_DIR"] == f"/t/{process.role}"
        other = next(r for r in schedule.ROLES if r != process.role)
        assert not any(k.startswith(schedule.ENV_PREFIX[other]) for k in env)
    assert not any("PROFILER" in k for p in plan.processes for k, _ in p.env)  # plan untouched


def test_launch_plan_cli_prints_the_variables(capsys):
    assert main(["--npu-topology", "dp1-ep1", "--model", "/m", "--no-api-key",
                 "--node-address", "127.0.0.1", "--profile", "--profile-steps", "3",
                 "--profile-dir", "/t"]) == 0
    text = capsys.readouterr().out
    assert "AFD_NPU_ATTENTION_PROFILER_ACTIVE=3" in text
    assert "AFD_NPU_FFN_PROFILER_DIR=/t/ffn" in text


@pytest.mark.parametrize("text", ["attention", "gpu=/x", "attention=", ""])
def test_bad_trace_dirs_are_named(text):
    with pytest.raises(ValueError, match=schedule.ENV_TRACE_DIRS):
        schedule.parse_trace_dirs(text)


class TraceWritingBackend:
    """Stands in for a deployment: its instrumented runs leave the fixture ranks' trees."""

    name = "stand-in"
    capabilities = frozenset()

    def __init__(self, trace_dirs, num_steps=2):
        self.trace_dirs = trace_dirs
        self.num_steps = num_steps

    def run(self, prompts, settings):
        if settings.instrument:
            for role, target in self.trace_dirs.items():
                shutil.copytree(DATA / role, target, dirs_exist_ok=True)
        return RunOutputs(requests=[], expert_load=[[3, 5, 1, 9], [4, 4, 4, 4]],
                          steps=[{"step": i} for i in range(self.num_steps)],
                          wall_time_s=2.0 if settings.instrument else 1.0)

    def describe(self):
        return {}


@pytest.mark.skipif(shutil.which("true") is None, reason="needs a POSIX userland")
def test_profiled_backend_fills_the_fields_from_fixture_traces(tmp_path, reused_msprof):
    """The traces are the fixture ranks' trees, so msprof-analyze's answer is the session's
    real output for them (tests/support/fixture_analysis.py), not a second run of it."""
    dirs = {role: tmp_path / role for role in schedule.ROLES}
    environ = {schedule.ENV_TRACE_DIRS: ",".join(f"{r}={p}" for r, p in dirs.items()),
               **schedule.profiler_env("attention", schedule.schedule_for(
                   prior_steps=0, warmup_steps=1, measured_steps=2), dirs["attention"])}
    backend = ProfiledBackend.wrap_from_env(TraceWritingBackend(dirs), environ)
    assert CAP_INSTRUMENTATION in backend.capabilities
    plain = backend.run(PROMPTS, RunSettings())
    assert plain.profile is None
    outputs = backend.run(PROMPTS, RunSettings(instrument=True))
    profile = outputs.profile
    assert profile is not None, backend.last_problem
    assert sorted(reused_msprof.reused) == sorted(dirs.values())  # both roles, each once
    assert profile["schedule"]["active"] == 2
    assert profile["profiler_overhead"]["ratio"] == pytest.approx(2.0)
    assert profile["straggler"]["expert_load_per_rank"] == [[8, 10], [8, 8]]
    assert {c["group"] for c in profile["collectives"]} == {"tp", "ep"}
    _check_stage_fields(outputs)
    # A second instrumented run with no new traces is named, not analysed twice.
    assert backend.run(PROMPTS, RunSettings(instrument=True)).profile is None
    assert "no new trace directory" in backend.last_problem


def test_unset_trace_dirs_leave_the_backend_alone():
    inner = TraceWritingBackend({})
    assert ProfiledBackend.wrap_from_env(inner, {}) is inner


def _stand_in_smi(directory: Path) -> Path:
    """An ``npu-smi`` that answers -t usages / -t power, a different load on each call."""
    script = directory / "npu-smi"
    log = directory / "served.txt"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        n=$(wc -l < "{log}" 2>/dev/null || echo 0)
        aicore=$(( (n * 37 + $5 * 11) % 100 ))
        echo "$5 $aicore" >> "{log}"
        if [ "$3" = usages ]; then
          echo "        HBM Capacity(MB)               : 65536"
          echo "        HBM Usage Rate(%)              : $(( 10 + $5 ))"
          echo "        Aicore Usage Rate(%)           : $aicore"
        else
          echo "        NPU Real-time Power(W)         : 1$5$aicore.5"
        fi
        """))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return log


def test_device_metrics_from_a_stand_in_npu_smi(tmp_path, monkeypatch):
    log = _stand_in_smi(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    sampler = device_metrics.Sampler.available({"attention": [0], "ffn": [1, 2]},
                                               interval_s=3600.0)
    assert sampler is not None
    metrics = sampler.start().stop()
    assert metrics["num_samples"] == 2  # at the start and at the end
    served = [line.split() for line in log.read_text().splitlines()]
    usages = {int(d): [] for d, _ in served}
    for index, (device, aicore) in enumerate(served):
        if index % 2 == 0:  # usages calls (each sample: usages then power)
            usages[int(device)].append(int(aicore))
    ffn = metrics["per_role"]["ffn"]
    assert ffn["aicore_percent"]["peak"] == max(usages[1] + usages[2])
    assert ffn["aicore_percent"]["count"] == 4
    assert ffn["hbm_used_bytes"]["peak"] == pytest.approx(65536 * 0.12 * (1 << 20))
    assert metrics["per_role"]["attention"]["power_w"]["count"] == 2


def test_device_metrics_absent_without_npu_smi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert device_metrics.Sampler.available({"attention": [0]}) is None
    assert "npu-smi" in device_metrics.unavailable()["absent_reason"]


def test_profiled_backend_samples_measured_runs_only(tmp_path, monkeypatch):
    _stand_in_smi(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    sampler = device_metrics.Sampler({"attention": [0]}, interval_s=3600.0)
    backend = ProfiledBackend.wrap_from_env(TraceWritingBackend({}), {}, sampler=sampler)
    assert CAP_INSTRUMENTATION not in backend.capabilities  # no traces to read
    assert backend.run(PROMPTS, RunSettings()).device_metrics["num_samples"] == 2
    assert backend.run(PROMPTS, RunSettings(instrument=True)).device_metrics is None


def test_layout_devices_split_by_role():
    from pytest_afd.topology.spec import parse_topology

    devices = device_metrics.layout_devices(parse_topology("dp2-ep2"), 16)
    assert set(devices) == {"attention", "ffn"}
    assert not set(devices["attention"]) & set(devices["ffn"])


def _check_stage_fields(outputs):
    """The fields Stage A (overlap/straggler/bubble) and Stage E (critical path) read."""
    import copy
    import sys

    suites = Path(__file__).parents[2] / "suites"
    sys.path[:0] = [str(suites / "stage_a"), str(suites / "stage_e")]
    try:
        from stage_a_analysis import afd_overlap
        from stage_e_heat import STEP_TIME_FIELDS
    finally:
        del sys.path[:2]
    assert outputs.profile["steps_attached"] is True
    overlap = afd_overlap(outputs.steps)
    assert overlap is not None and 0 < overlap["overlap_fraction"] < 1
    assert overlap["straggler_s"] > 0  # FFN rank 1 is slower on layer 2 in the fixture
    assert ("profile", "critical_path_s") in STEP_TIME_FIELDS
    assert all(step["profile"]["critical_path_s"] > 0 for step in outputs.steps)
    # A run with another step count is not forced onto the profile's steps.
    steps = [{"step": i} for i in range(3)]
    problem = evidence.attach_to_steps(steps, copy.deepcopy(outputs.profile))
    assert "3" in problem and all("profile" not in step for step in steps)


def test_overhead_compares_a_case_with_its_own_prompts_only(tmp_path, reused_msprof):
    """Workloads reuse request ids: a run of other prompts is not the case's reference."""
    dirs = {role: tmp_path / role for role in schedule.ROLES}
    environ = {schedule.ENV_TRACE_DIRS: ",".join(f"{r}={p}" for r, p in dirs.items())}
    backend = ProfiledBackend.wrap_from_env(TraceWritingBackend(dirs), environ)
    other = [PromptRequest("r0", (7, 7, 7, 7))]  # same id, other tokens
    for _ in range(3):
        backend.run(other, RunSettings())
    backend.run(PROMPTS, RunSettings())
    outputs = backend.run(PROMPTS, RunSettings(instrument=True))
    assert outputs.profile is not None, backend.last_problem
    assert outputs.profile["profiler_overhead"]["non_instrumented_runs"] == 1
