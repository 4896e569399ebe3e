"""Launch mode: instrumented runs go to a deployment the harness starts with the plugin
profiler on, its schedule computed from the case, so the user sets nothing.

The plugin's profiler is configured once per process, from its environment
(``schedule``): its window cannot be moved to one run of a deployment already
serving measured runs. So, in launch mode, ``instrument`` is a server-side
field: the measured runs are served by a plain deployment (no profiler loaded,
headline numbers untouched) and the instrumented run by one launched with
``schedule.apply_to_plan``. On it ``ProfiledBackend`` sends ``warmup_runs``
warm-up runs, the recorded run, then one flush run: torch's profiler saves a
window when ``step()`` is called at the start of the *next* engine step
(afd-plugin 2e4378f / 2f4f462 step it at the top of ``execute_model``), so the
recorded run's traces exist only once another step starts. The profiled
deployment is then stopped, and the next instrumented case gets a fresh one.

The schedule is ``schedule_for(prior_steps=0, warmup_steps=warmup_runs * k,
measured_steps=k)``, k = the engine steps of one run of the case: the number of
step records of its measured runs (Attention ranks' evidence, ``AFD_EVIDENCE_DIR``),
else 1 (one prefill batch per run: prompts within ``max_num_batched_tokens``).
A wrong k records a shifted window; the result's ``profile.schedule`` says
which was used, with ``steps_per_run_source``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_afd.profiling.schedule import (
    PLUGIN_REVISION,
    ProfilerSchedule,
    apply_to_plan,
    role_trace_dirs,
    schedule_for,
)

INSTRUMENT_FIELD = "instrument"
"""The RunSettings field that, in launch mode, picks the profiled deployment."""
TRACE_ROOT_NAME = "profiles"
WARMUP_RUNS = 1
FLUSH_RUNS = 1
DEFAULT_STEPS_PER_RUN = 1
STEPS_FROM_EVIDENCE = "the case's measured runs' step records"
STEPS_ASSUMED = "assumed: one engine step per run (no step evidence)"


@dataclass
class LaunchProfile:
    """What the launcher and ``ProfiledBackend`` share: where traces go, the schedule."""

    trace_root: Path
    warmup_runs: int = WARMUP_RUNS
    steps_per_run: int = DEFAULT_STEPS_PER_RUN
    steps_source: str = STEPS_ASSUMED

    def __post_init__(self) -> None:
        self.trace_root = Path(self.trace_root)
        if self.warmup_runs < 1:
            raise ValueError(f"warmup_runs={self.warmup_runs}: the profiled deployment needs "
                             ">= 1 warm-up run (its first run is cold)")

    def trace_dirs(self) -> dict[str, Path]:
        return role_trace_dirs(self.trace_root)

    def use_steps(self, steps: int | None) -> None:
        """The engine steps of one run of the case about to be profiled (None: unknown)."""
        if steps:
            self.steps_per_run, self.steps_source = steps, STEPS_FROM_EVIDENCE
        else:
            self.steps_per_run, self.steps_source = DEFAULT_STEPS_PER_RUN, STEPS_ASSUMED

    def schedule(self) -> ProfilerSchedule:
        return schedule_for(prior_steps=0, warmup_steps=self.warmup_runs * self.steps_per_run,
                            measured_steps=self.steps_per_run)

    def plan_for(self, plan, settings):
        """``plan`` with both roles' profilers on when ``settings`` is the instrumented run's."""
        if not getattr(settings, INSTRUMENT_FIELD):
            return plan
        return apply_to_plan(plan, self.schedule(), self.trace_root)

    def describe(self) -> dict[str, Any]:
        return {**self.schedule().to_json(), "plugin": PLUGIN_REVISION,
                "warmup_runs": self.warmup_runs, "flush_runs": FLUSH_RUNS,
                "steps_per_run": self.steps_per_run, "steps_per_run_source": self.steps_source,
                "applied_by": "launch plan"}
