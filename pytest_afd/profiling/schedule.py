"""The AFD plugin's own profiler: its variables, and the schedule that captures a case's steps.

afd-plugin main 2e4378f / release/v0.19.1rc1 2f4f462,
``afd_plugin/compat/npu/profiler.py``: each role's runner creates a
``torch_npu.profiler.profile`` (Text export, Level2, record_shapes) when
``AFD_NPU_<ROLE>_PROFILER_ENABLE`` is true and steps it once per
``execute_model`` (Attention) / FFN step. Variables and plugin defaults:

    ENABLE (false)  WAIT (2)  WARMUP (1)  ACTIVE (attention 10, ffn 20)  REPEAT (1)
    SKIP_FIRST (1500)  DIR (-> $VLLM_TORCH_PROFILER_DIR -> /tmp/profile/{attn,ffn})
    WITH_STACK (false)

``tests/e2e/features/test_profiler_npu.py`` switches both roles on the same way.
torch's schedule skips ``skip_first`` steps, then cycles ``wait`` (off),
``warmup`` (traced, discarded), ``active`` (recorded). For a case whose
warm-ups take W engine steps and whose measured repetitions take S, after P
earlier steps of the deployment: skip_first=P, wait=W-1, warmup=1 (the last
warm-up step warms the profiler), active=S, repeat=1, so exactly the S measured
steps are recorded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROLES = ("attention", "ffn")
ENV_PREFIX = {"attention": "AFD_NPU_ATTENTION_PROFILER", "ffn": "AFD_NPU_FFN_PROFILER"}
FIELDS = ("ENABLE", "WAIT", "WARMUP", "ACTIVE", "REPEAT", "SKIP_FIRST", "DIR", "WITH_STACK")
PLUGIN_DEFAULTS: Mapping[str, Mapping[str, Any]] = {
    role: {"wait": 2, "warmup": 1, "active": active, "repeat": 1, "skip_first": 1500}
    for role, active in (("attention", 10), ("ffn", 20))
}
PLUGIN_REVISION = "afd-plugin main 2e4378f / release/v0.19.1rc1 2f4f462"
# Attach mode: where the deployment's roles write their traces ("attention=DIR,ffn=DIR"),
# or "torch=DIR": where CPU servers keep their torch.profiler trace roots
# (AFD_PROFILE_KEEP_TRACES on the server side; the CI rehearsal).
ENV_TRACE_DIRS = "AFD_PROFILE_TRACE_DIRS"
TORCH_KEY = "torch"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


@dataclass(frozen=True)
class ProfilerSchedule:
    skip_first: int
    wait: int
    warmup: int
    active: int
    repeat: int = 1

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"profiler schedule {item.name}={value!r}: expected an integer >= 0")
        if self.active < 1 or self.repeat < 1:
            raise ValueError(f"profiler schedule active={self.active}, repeat={self.repeat}: "
                             "both must be >= 1 to record anything")

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def schedule_for(*, prior_steps: int, warmup_steps: int, measured_steps: int) -> ProfilerSchedule:
    """The schedule recording exactly the ``measured_steps`` after ``warmup_steps`` warm-ups."""
    if measured_steps < 1:
        raise ValueError(f"measured_steps={measured_steps}: an instrumented case needs >= 1 step")
    return ProfilerSchedule(skip_first=prior_steps, wait=max(0, warmup_steps - 1),
                            warmup=min(1, warmup_steps), active=measured_steps)


def profiler_env(role: str, schedule: ProfilerSchedule, trace_dir: str | Path,
                 with_stack: bool = False) -> dict[str, str]:
    """The plugin's variables that switch ``role``'s profiler on with ``schedule``."""
    if role not in ENV_PREFIX:
        raise ValueError(f"profiler role {role!r}: expected one of {ROLES}")
    prefix = ENV_PREFIX[role]
    values = {"ENABLE": "true", "WAIT": schedule.wait, "WARMUP": schedule.warmup,
              "ACTIVE": schedule.active, "REPEAT": schedule.repeat,
              "SKIP_FIRST": schedule.skip_first, "DIR": str(trace_dir),
              "WITH_STACK": "true" if with_stack else "false"}
    return {f"{prefix}_{name}": str(values[name]) for name in FIELDS}


def role_trace_dirs(trace_root: str | Path) -> dict[str, Path]:
    return {role: Path(trace_root) / role for role in ROLES}


def apply_to_plan(plan, schedule: ProfilerSchedule, trace_root: str | Path):
    """``plan`` with every Attention / FFN process's profiler switched on (a new plan)."""
    dirs = role_trace_dirs(trace_root)
    processes = []
    for process in plan.processes:
        if process.role in ENV_PREFIX:
            env = dict(process.env) | profiler_env(process.role, schedule, dirs[process.role])
            process = dataclasses.replace(process, env=tuple(sorted(env.items())))
        processes.append(process)
    return dataclasses.replace(plan, processes=tuple(processes))


def read_schedule(role: str, environ: Mapping[str, str]) -> ProfilerSchedule | None:
    """The schedule ``role``'s plugin profiler runs with under ``environ`` (None: disabled).

    Read as the plugin reads it (same defaults); a bad value is named with its variable.
    """
    prefix = ENV_PREFIX[role]
    enabled = environ.get(f"{prefix}_ENABLE", "false").strip().lower()
    if enabled not in _TRUE | _FALSE:
        raise ValueError(f"{prefix}_ENABLE={environ[f'{prefix}_ENABLE']!r}: expected a boolean")
    if enabled in _FALSE:
        return None
    values = {}
    for name, default in PLUGIN_DEFAULTS[role].items():
        variable = f"{prefix}_{name.upper()}"
        text = environ.get(variable)
        try:
            values[name] = default if text is None else int(text)
        except ValueError:
            raise ValueError(f"{variable}={text!r}: expected an integer") from None
    return ProfilerSchedule(**values)


def parse_trace_dirs(text: str, source: str = ENV_TRACE_DIRS) -> dict[str, Path]:
    """``attention=DIR,ffn=DIR`` -> {role: Path}; errors name ``source`` and the bad item."""
    dirs: dict[str, Path] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        role, sep, path = item.partition("=")
        if not sep or role.strip() not in (*ENV_PREFIX, TORCH_KEY) or not path.strip():
            raise ValueError(f"{source}: {item!r} is not ROLE=DIR with ROLE one of "
                             f"{(*ROLES, TORCH_KEY)}")
        dirs[role.strip()] = Path(path.strip())
    if not dirs:
        raise ValueError(f"{source}={text!r}: name at least one ROLE=DIR")
    if TORCH_KEY in dirs and len(dirs) > 1:
        raise ValueError(f"{source}={text!r}: {TORCH_KEY}=DIR (CPU traces) goes alone")
    return dirs
