"""A backend whose instrumented runs come back with their profile, and measured runs with
device metrics and wall times (for ``profiler_overhead``).

Wraps any backend (the vllm-ascend one in launch or attach mode, a rehearsal
against CPU servers) when ``AFD_PROFILE_TRACE_DIRS=attention=DIR,ffn=DIR``
names where the deployment's roles write their ``*_ascend_pt`` trees (launch:
the plan's ``AFD_NPU_<ROLE>_PROFILER_DIR``; attach: what the user gave
``afd-launch-plan --profile``). An instrumented run analyses the rank
directories that appeared during it; the schedule recorded is the one the
plugin reads from ``AFD_NPU_<ROLE>_PROFILER_*`` in this environment (export
the printed variables on both sides), else absent with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from statistics import fmean
from typing import Any

from pytest_afd.core.backend import CAP_INSTRUMENTATION, PromptRequest, RunOutputs, RunSettings
from pytest_afd.profiling import ascend, cpu_run, device_metrics, evidence, schedule
from pytest_afd.profiling.launch_profile import FLUSH_RUNS, LaunchProfile
from pytest_afd.profiling.msprof import ProfilingUnavailable
from pytest_afd.results.manifest import absent

ASCEND_PT_SUFFIX = "_ascend_pt"
CPU_WINDOW = ("no plugin profiler schedule: the harness's CPU servers profile exactly the "
              "batches of the instrumented run's marked requests")


def rank_dir_names(role_dir: Path) -> set[str]:
    if not role_dir.is_dir():
        return set()
    return {str(p.relative_to(role_dir)) for p in role_dir.rglob(f"*{ASCEND_PT_SUFFIX}")
            if p.is_dir()}


def _case_key(prompts: Sequence[PromptRequest], settings: RunSettings) -> tuple:
    """A case's runs: its prompts (workloads reuse request ids, so the tokens count too)."""
    return (tuple((p.request_id, hash(tuple(p.prompt_token_ids))) for p in prompts),
            replace(settings, instrument=False))


class ProfiledBackend:
    """``inner`` plus trace analysis of instrumented runs and metrics of measured ones."""

    def __init__(self, inner, trace_dirs: Mapping[str, Path], *,
                 environ: Mapping[str, str], sampler: device_metrics.Sampler | None = None,
                 scratch: Path | None = None, launch: LaunchProfile | None = None) -> None:
        self._inner = inner
        self.launch = launch
        self.trace_dirs = {role: Path(path) for role, path in trace_dirs.items()}
        self.environ = dict(environ)
        self.sampler = sampler
        self.scratch = scratch
        self._plain_wall: dict[tuple, list[float]] = {}
        self._steps_per_run: dict[tuple, int] = {}
        self.last_problem: str | None = None

    @classmethod
    def wrap_from_env(cls, inner, environ: Mapping[str, str], **kwargs):
        """``inner`` wrapped when ``AFD_PROFILE_TRACE_DIRS`` is set or a device sampler is
        given (measured runs sample npu-smi); bad values fail here."""
        text = environ.get(schedule.ENV_TRACE_DIRS)
        if not text and kwargs.get("sampler") is None:
            return inner
        dirs = schedule.parse_trace_dirs(text) if text else {}
        return cls(inner, dirs, environ=environ, **kwargs)

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def capabilities(self) -> frozenset[str]:
        # Instrumentation only where there are traces to read.
        extra = {CAP_INSTRUMENTATION} if self.trace_dirs else set()
        return self._inner.capabilities | extra

    def run(self, prompts: Sequence[PromptRequest], settings: RunSettings) -> RunOutputs:
        if not settings.instrument:
            return self._measured(prompts, settings)
        if not self.trace_dirs:
            return self._inner.run(prompts, settings)
        before = {role: self._found(role, path) for role, path in self.trace_dirs.items()}
        key = _case_key(prompts, settings)
        if self.launch is None:
            started = time.perf_counter()
            outputs = self._inner.run(prompts, settings)
            wall = outputs.wall_time_s or time.perf_counter() - started
        else:
            outputs, wall = self._on_profiled_deployment(prompts, settings, key)
        new = {role: sorted(self._found(role, path) - before[role])
               for role, path in self.trace_dirs.items()}
        outputs.profile = self._analyse(new, outputs, wall, key)
        if outputs.profile is None:
            outputs.profile_absent_reason = self.last_problem
        else:
            problem = evidence.attach_to_steps(outputs.steps, outputs.profile)
            outputs.profile["steps_attached"] = problem is None
            if problem:
                outputs.profile["steps_attached_reason"] = problem
        return outputs

    def _on_profiled_deployment(self, prompts: Sequence[PromptRequest], settings: RunSettings,
                                key: tuple) -> tuple[RunOutputs, float]:
        """Launch mode: warm-up runs, the recorded run, one flush run (its first engine step
        saves the recorded window); then the profiled deployment is stopped, also on a
        failure, so the next instrumented case starts a fresh window."""
        self.launch.use_steps(self._steps_per_run.get(key))
        try:
            for _ in range(self.launch.warmup_runs):
                self._inner.run(prompts, settings)
            started = time.perf_counter()
            outputs = self._inner.run(prompts, settings)
            wall = outputs.wall_time_s or time.perf_counter() - started
            for _ in range(FLUSH_RUNS):
                self._inner.run(prompts[:1], settings)
        finally:
            drop = getattr(self._inner, "drop_session", None)
            if drop is not None:
                drop()
        return outputs, wall

    def _measured(self, prompts: Sequence[PromptRequest], settings: RunSettings) -> RunOutputs:
        handle = self.sampler.start() if self.sampler is not None else None
        started = time.perf_counter()
        try:
            outputs = self._inner.run(prompts, settings)
        finally:
            samples = handle.stop() if handle is not None else None
        wall = outputs.wall_time_s or time.perf_counter() - started
        key = _case_key(prompts, settings)
        self._plain_wall.setdefault(key, []).append(wall)
        if outputs.steps:  # engine steps of one run of the case (launch-mode schedule)
            self._steps_per_run[key] = len(outputs.steps)
        if samples is not None:
            outputs.device_metrics = samples
        return outputs

    @staticmethod
    def _found(role: str, path: Path) -> set[str]:
        if role == schedule.TORCH_KEY:  # CPU servers' kept trace roots (cpu_run)
            return {p.name for p in path.glob(f"{cpu_run.TRACE_ROOT_PREFIX}*")} if path.is_dir() \
                else set()
        return rank_dir_names(path)

    def _analyse(self, new: Mapping[str, list[str]], outputs: RunOutputs, wall: float,
                 key: tuple) -> dict[str, Any] | None:
        missing = [role for role, names in new.items() if not names]
        if missing:
            self.last_problem = (f"no new trace directory (*_ascend_pt, afd-traces-*) under "
                                 f"{', '.join(str(self.trace_dirs[r]) for r in missing)} "
                                 "after the instrumented run (is the plugin profiler on, with "
                                 "this schedule?)")
            return None
        if schedule.TORCH_KEY in new:
            return self._analyse_torch(new[schedule.TORCH_KEY], outputs, wall, key)
        staging = {role: self._stage(role, names) for role, names in new.items()}
        try:
            return ascend.analyse(staging,
                                  expert_load_per_rank=_per_rank(outputs, len(new.get("ffn", []))),
                                  schedule=self._schedule(), overhead=self._overhead(key, wall))
        except (ProfilingUnavailable, ValueError) as error:
            self.last_problem = str(error)
            return None

    def _analyse_torch(self, names: list[str], outputs: RunOutputs, wall: float,
                       key: tuple) -> dict[str, Any] | None:
        """The CPU servers' trace roots of this run, merged (steps are numbered per runtime)."""
        import shutil
        import tempfile

        from pytest_afd.profiling import torch_trace

        staged = Path(tempfile.mkdtemp(prefix="afd-torch-", dir=self.scratch))
        try:
            for name in names:
                shutil.copytree(self.trace_dirs[schedule.TORCH_KEY] / name, staged,
                                dirs_exist_ok=True)
            num_ffn = len(list((staged / "ffn").glob("rank*"))) if (staged / "ffn").is_dir() else 0
            return torch_trace.analyse(staged, expert_load_per_rank=_per_rank(outputs, num_ffn),
                                       schedule=absent(CPU_WINDOW), overhead=self._overhead(key, wall))
        except (ValueError, RuntimeError, ImportError) as error:
            self.last_problem = str(error)
            return None
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def _stage(self, role: str, names: list[str]) -> Path:
        """The directory msprof-analyze reads for this run: the new rank dirs only."""
        root = self.trace_dirs[role]
        if set(names) == rank_dir_names(root):
            return root
        import shutil
        import tempfile

        staged = Path(tempfile.mkdtemp(prefix=f"afd-{role}-", dir=self.scratch))
        for name in names:
            shutil.copytree(root / name, staged / Path(name).name)
        return staged

    def _schedule(self) -> dict[str, Any] | None:
        if self.launch is not None:
            return self.launch.describe()
        schedules = {}
        for role in self.trace_dirs:
            try:
                found = schedule.read_schedule(role, self.environ)
            except ValueError:
                found = None
            if found is not None:
                schedules[role] = found.to_json()
        if not schedules:
            return None
        first = next(iter(schedules.values()))
        return {**first, "per_role": schedules, "plugin": schedule.PLUGIN_REVISION}

    def _overhead(self, key: tuple, wall: float) -> dict[str, Any] | None:
        plain = self._plain_wall.get(key)
        if not plain:
            return None
        reference = fmean(plain)
        return {"instrumented_wall_s": wall, "non_instrumented_wall_s": reference,
                "non_instrumented_runs": len(plain),
                "ratio": wall / reference if reference > 0 else absent("zero reference wall")}

    def reset_prefix_cache(self) -> None:
        self._inner.reset_prefix_cache()

    def describe(self) -> dict[str, Any]:
        description = dict(self._inner.describe())
        description["profiling"] = {
            "trace_dirs": {role: str(path) for role, path in self.trace_dirs.items()},
            "device_metrics": self.sampler.describe() if self.sampler else absent(
                "no npu-smi sampler"),
            "last_problem": self.last_problem}
        return description

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def _per_rank(outputs: RunOutputs, num_ffn_ranks: int) -> list[list[int]] | None:
    """Per MoE layer, routed tokens per FFN (EP) rank of the same steps (the run's expert load)."""
    if not outputs.expert_load or num_ffn_ranks < 1:
        return None
    from pytest_afd.results.parts import per_rank_load

    try:
        return per_rank_load(outputs.expert_load, num_ffn_ranks)
    except ValueError:
        return None
