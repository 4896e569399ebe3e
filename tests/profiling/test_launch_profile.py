"""Launch mode applies the plugin profiler's schedule itself: the instrumented run's
deployment is launched with both roles' variables, and the window the schedule opens
holds exactly the instrumented run's engine steps (a stand-in deployment that steps
its profiler as torch does: a window is saved when the next step starts)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_afd.backends.vllm_ascend import backend as ascend_backend
from pytest_afd.core.backend import PromptRequest, RunOutputs, RunSettings
from pytest_afd.profiling import schedule
from pytest_afd.profiling.backend import ProfiledBackend
from pytest_afd.profiling.launch_profile import STEPS_ASSUMED, STEPS_FROM_EVIDENCE, LaunchProfile
from pytest_afd.topology.spec import parse_topology

DATA = Path(__file__).with_name("data")
PROMPTS = [PromptRequest("r0", (1, 2, 3)), PromptRequest("r1", (4, 5))]
STEPS_PER_RUN = 2  # the stand-in deployment's engine steps for a run of PROMPTS


class FakeGroup:
    """Captures the specs the launcher would start (in ``started``, given per test)."""

    def __init__(self, specs, log_dir, started: list) -> None:
        self.specs = specs
        self.started = started

    def start(self):
        self.started.append(self.specs)
        return self

    def stop(self) -> None:
        pass

    def exit_reason(self):
        return None


def _profiler_env(specs) -> dict[str, dict[str, str]]:
    return {spec.name: {k: v for k, v in spec.env.items() if "_PROFILER_" in k} for spec in specs}


def test_the_instrumented_deployment_is_launched_with_the_schedule(tmp_path, monkeypatch):
    started: list = []
    monkeypatch.setattr(ascend_backend, "ServerGroup",
                        lambda specs, log_dir: FakeGroup(specs, log_dir, started))
    profile = LaunchProfile(tmp_path / "profiles")
    profile.use_steps(3)
    launch = ascend_backend.local_launcher(parse_topology("dp1-ep1"), model="/m", devices=2,
                                           log_dir=tmp_path / "servers", startup_timeout_s=1.0,
                                           profile=profile)
    launch(RunSettings())
    launch(RunSettings(instrument=True))
    plain, profiled = (_profiler_env(specs) for specs in started)
    assert not any(plain.values())  # measured runs: no profiler loaded
    roles = {name: role for name in profiled for role in schedule.ROLES if role in name}
    assert set(roles.values()) == set(schedule.ROLES)
    for name, role in roles.items():
        read = schedule.read_schedule(role, profiled[name])
        assert read == schedule.ProfilerSchedule(skip_first=0, wait=2, warmup=1, active=3)
        assert profiled[name][f"{schedule.ENV_PREFIX[role]}_DIR"] == str(
            tmp_path / "profiles" / role)


class SteppedDeployments:
    """Deployments as the harness's HttpBackend sees them: a run starts one for its settings
    when none runs; the profiled one reads the schedule at launch, calls ``step()`` at the
    start of every engine step, and saves a window (the fixture ranks' trees) when the
    step after it starts, remembering which runs the saved steps belonged to."""

    name = "stand-in"
    capabilities = frozenset()

    def __init__(self, profile: LaunchProfile) -> None:
        self.profile = profile
        self.running: RunSettings | None = None
        self.window = None
        self.step = 0
        self.step_runs: list[int] = []
        self.saved_runs: list[list[int]] = []
        self.runs = 0
        self.launches = 0

    def run(self, prompts, settings):
        if self.running != settings:
            self.running, self.launches = settings, self.launches + 1
            self.window = self.profile.schedule() if settings.instrument else None
            self.step, self.step_runs = 0, []
        self.runs += 1
        for _ in range(STEPS_PER_RUN if len(prompts) > 1 else 1):
            self._engine_step()
        return RunOutputs(requests=[], expert_load=[[3, 5, 1, 9], [4, 4, 4, 4]],
                          steps=[{"step": i} for i in range(STEPS_PER_RUN)],
                          wall_time_s=2.0 if settings.instrument else 1.0)

    def _engine_step(self) -> None:
        if self.window is not None:
            first = self.window.skip_first + self.window.wait + self.window.warmup
            if self.step == first + self.window.active:  # step(): the window ends, saved
                self.saved_runs.append(self.step_runs[first:])
                for role in schedule.ROLES:
                    shutil.copytree(DATA / role, self.profile.trace_root / role,
                                    dirs_exist_ok=True)
        self.step_runs.append(self.runs)
        self.step += 1

    def drop_session(self) -> None:
        self.running = None

    def describe(self):
        return {}


def test_the_window_holds_exactly_the_instrumented_run(tmp_path, reused_msprof):
    profile = LaunchProfile(tmp_path / "profiles")
    deployments = SteppedDeployments(profile)
    backend = ProfiledBackend(deployments, profile.trace_dirs(), environ={}, launch=profile)
    for _ in range(2):
        assert backend.run(PROMPTS, RunSettings()).profile is None
    outputs = backend.run(PROMPTS, RunSettings(instrument=True))
    assert outputs.profile is not None, backend.last_problem
    # runs 1-2 measured, 3 = warm-up on the profiled deployment, 4 = the instrumented run
    # (two engine steps), 5 = the flush run whose first step saved the window.
    assert deployments.saved_runs == [[4, 4]]
    assert deployments.runs == 5 and deployments.launches == 2
    recorded = outputs.profile["schedule"]
    assert recorded["active"] == STEPS_PER_RUN and recorded["skip_first"] == 0
    assert recorded["steps_per_run_source"] == STEPS_FROM_EVIDENCE
    assert recorded["applied_by"] == "launch plan"
    assert outputs.profile["profiler_overhead"]["ratio"] == pytest.approx(2.0)
    # The profiled deployment was stopped: the next instrumented case gets a fresh window.
    assert deployments.running is None
    backend.run(PROMPTS, RunSettings(instrument=True))
    assert deployments.launches == 3 and deployments.saved_runs[-1] == [7, 7]


def test_without_step_evidence_one_step_per_run_is_assumed_and_said(tmp_path):
    profile = LaunchProfile(tmp_path)
    profile.use_steps(None)
    assert profile.schedule().active == 1 and profile.describe()["steps_per_run_source"] == (
        STEPS_ASSUMED)
    with pytest.raises(ValueError, match="warmup_runs=0"):
        LaunchProfile(tmp_path, warmup_runs=0)
