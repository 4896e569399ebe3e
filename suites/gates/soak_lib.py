"""Gate 5's soak driver and leak detectors (the test module holds only the cases).

The soak runs many small ``Backend.run`` calls of random batches through the
backend protocol. Its detectors see what a run leaves behind:

* :class:`WeakSplitLog` (a ``SplitObserver``) holds weak references to every
  step's plan, parent metadata and parts, and checks the split invariants and
  that the parent was not mutated; after each run all of them must be dead;
* :func:`module_state` scans ``afd_split`` and the executor modules' globals
  (added or rebound names, containers that grew);
* allocated Python memory blocks (``sys.getallocatedblocks``) and gc-tracked
  objects must not grow beyond a bound between the warmed-up start and the end,
  nor traced bytes (``tracemalloc``) over the soak's last forwards.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import tracemalloc
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from step_evidence_checks import step_count_problems

from afd_split import SplitInvariantError
from afd_split.checks.metadata import validate_split

# Modules whose globals a leak or a contamination would grow: the split path and
# the executor that drives it.
SCANNED_MODULE_PREFIXES = ("afd_split",)
SCANNED_MODULES = ("pytest_afd.backends.cpu.executor", "pytest_afd.backends.cpu.backend")
CONTAINER_TYPES = (list, dict, set, tuple, frozenset)
PARENT_FIELDS = (
    "query_start_loc", "seq_lens", "num_computed_tokens", "slot_mapping", "block_table",
    "positions",
)  # fmt: skip
WATCHDOG_POLL_S = 0.2


def module_state(module_names: Iterable[str] | None = None) -> dict[str, tuple[int, int | None]]:
    """``module.name -> (id, len or None)`` of every non-dunder global of the scanned modules."""
    if module_names is None:
        module_names = [
            name for name in sorted(sys.modules)
            if name.startswith(SCANNED_MODULE_PREFIXES) or name in SCANNED_MODULES
        ]  # fmt: skip
    state = {}
    for module_name in module_names:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for name, value in vars(module).items():
            if name.startswith("__"):
                continue
            size = len(value) if isinstance(value, CONTAINER_TYPES) else None
            state[f"{module_name}.{name}"] = (id(value), size)
    return state


def module_state_changes(before: dict, after: dict) -> list[str]:
    """Names added, removed, rebound or grown between two :func:`module_state` scans."""
    changes = [f"added {name}" for name in sorted(set(after) - set(before))]
    changes += [f"removed {name}" for name in sorted(set(before) - set(after))]
    for name in sorted(set(before) & set(after)):
        (old_id, old_len), (new_id, new_len) = before[name], after[name]
        if old_id != new_id:
            changes.append(f"rebound {name}")
        elif old_len != new_len:
            changes.append(f"{name} changed size {old_len} -> {new_len}")
    return changes


class _LifetimeProbe:
    """Stands in for an object that takes no weak reference, and lives exactly as long."""


LIFETIME_PROBE_KEY = "_soak_lifetime_probe"


def lifetime_ref(obj) -> weakref.ref:
    """A weak reference that goes dead with ``obj``.

    Plans and ubatches take weak references (slotted dataclasses with a weakref slot);
    an object that takes none gets a probe held only by its instance dict, which dies
    with it.
    """
    try:
        return weakref.ref(obj)
    except TypeError:
        # One probe per record: a record logged twice keeps both references alive.
        return weakref.ref(vars(obj).setdefault(LIFETIME_PROBE_KEY, _LifetimeProbe()))


@dataclass
class WeakSplitLog:
    """SplitObserver keeping only weak references, and the invariant checks, per run."""

    forwards: int = 0
    violations: list[str] = field(default_factory=list)
    refs: list[tuple[str, weakref.ref]] = field(default_factory=list)
    _parents: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)

    def before_split(self, plan, metadata) -> None:
        self._parents[id(metadata)] = {
            name: np.array(getattr(metadata, name), copy=True) for name in PARENT_FIELDS
        }

    def after_split(self, plan, metadata, parts) -> None:
        label = f"forward {self.forwards}"
        before = self._parents.pop(id(metadata))
        try:
            validate_split(plan, metadata, parts)
        except SplitInvariantError as error:
            self.violations.append(f"{label}: {error}")
        changed = [n for n, v in before.items() if not np.array_equal(getattr(metadata, n), v)]
        if changed:
            self.violations.append(f"{label}: the split mutated the parent's {changed}")
        self.refs.append((f"{label} plan", lifetime_ref(plan)))
        self.refs.append((f"{label} metadata", lifetime_ref(metadata)))
        self.refs.extend((f"{label} part {i}", lifetime_ref(p)) for i, p in enumerate(parts))
        self.forwards += 1

    def alive_after_run(self) -> list[str]:
        """What of this run's splits is still referenced (after a collection); then forget them."""
        alive = [label for label, ref in self.refs if ref() is not None]
        if alive:
            gc.collect()
            alive = [label for label, ref in self.refs if ref() is not None]
        self.refs.clear()
        return alive


@dataclass
class MemoryProbe:
    """Growth of allocated Python memory blocks and gc-tracked objects over the whole soak,
    and of traced bytes over its last forwards (each read after collection).

    Blocks count every object of up to 512 bytes (an array's or tensor's header too),
    whether or not gc tracks it, and cost nothing to read. Larger buffers bypass them, so
    ``tracemalloc`` traces the bytes of a trailing window; tracing the whole soak made it
    about four times slower (50 s against 12 s for ~1,000 forwards here).
    """

    start_blocks: int = 0
    start_objects: int = 0
    end_blocks: int = 0
    end_objects: int = 0
    traced_bytes: int = 0
    traced_forwards: int = 0
    _traced_from: int = 0
    _trace_start_bytes: int = 0

    def start(self) -> None:
        gc.collect()
        self.start_blocks = sys.getallocatedblocks()
        self.start_objects = len(gc.get_objects())

    @property
    def tracing(self) -> bool:
        return tracemalloc.is_tracing()

    def trace(self, forwards_done: int) -> None:
        """Begin the traced window after ``forwards_done`` forwards."""
        gc.collect()
        tracemalloc.start()
        self._traced_from = forwards_done
        self._trace_start_bytes = tracemalloc.get_traced_memory()[0]

    def stop(self, forwards_done: int) -> None:
        gc.collect()
        self.end_blocks = sys.getallocatedblocks()
        self.end_objects = len(gc.get_objects())
        if tracemalloc.is_tracing():
            self.traced_bytes = tracemalloc.get_traced_memory()[0] - self._trace_start_bytes
            self.traced_forwards = forwards_done - self._traced_from
            tracemalloc.stop()

    def close(self) -> None:
        """Stop tracing if the window is still open (the soak stopped early)."""
        if tracemalloc.is_tracing():
            tracemalloc.stop()

    @property
    def blocks_growth(self) -> int:
        return self.end_blocks - self.start_blocks

    @property
    def objects_growth(self) -> int:
        return self.end_objects - self.start_objects


@dataclass
class SoakProgress:
    """Shared between the soak thread and the watchdog."""

    steps_done: int = 0
    last_progress: float = field(default_factory=time.monotonic)
    error: BaseException | None = None
    finished: bool = False


def run_watched(target, progress: SoakProgress, *, step_timeout_s: float, soak_timeout_s: float
                ) -> str | None:
    """Run ``target(progress)`` in a thread; the reason it hung, or None."""

    def worker() -> None:
        try:
            target(progress)
        except BaseException as error:  # handed to the test thread
            progress.error = error
        finally:
            progress.finished = True

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    return watch(thread, progress, step_timeout_s=step_timeout_s, soak_timeout_s=soak_timeout_s)


def watch(thread: threading.Thread, progress: SoakProgress, *, step_timeout_s: float,
          soak_timeout_s: float) -> str | None:
    """Wait for the soak, bounded; the reason it hung, or None."""
    started = time.monotonic()
    while thread.is_alive():
        thread.join(WATCHDOG_POLL_S)
        now = time.monotonic()
        if now - progress.last_progress > step_timeout_s:
            return f"step {progress.steps_done} made no progress for {step_timeout_s:g} s"
        if now - started > soak_timeout_s:
            return f"the soak exceeded {soak_timeout_s:g} s at step {progress.steps_done}"
    return None


MAX_REPORTED_PROBLEMS = 20
"""Step-count problems kept in the soak's result (the assertion names the first)."""


@dataclass
class StepCounts:
    """What the run's own step evidence says the soak's forwards were."""

    forwards: int = 0
    split: int = 0
    partial_request: int = 0
    partial_with_computed: int = 0
    fallback: int = 0
    unsplit_policy: int = 0
    policies: dict[str, int] = field(default_factory=dict)
    # Step records whose real / padded counts disagree with the schedule and the cut.
    count_problems: list[str] = field(default_factory=list)

    def add(self, steps: list[dict[str, Any]]) -> None:
        for step in steps:
            self.count_problems.extend(step_count_problems(step, f"soak forward {self.forwards}"))
            self.forwards += 1
            self.policies[step["policy"]] = self.policies.get(step["policy"], 0) + 1
            self.unsplit_policy += step["policy"] == "none"
            self.fallback += step["fallback_reason"] is not None
            if not step["is_split"]:
                continue
            self.split += 1
            local = step["boundary_request"]
            if local is not None:
                self.partial_request += 1
                self.partial_with_computed += step["schedule"]["num_computed_tokens"][local] > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "forwards": self.forwards,
            "truly_split": self.split,
            "partial_request_cuts": self.partial_request,
            "partial_cuts_with_computed_tokens": self.partial_with_computed,
            "fallbacks": self.fallback,
            "unsplit_policy_steps": self.unsplit_policy,
            "policies": dict(sorted(self.policies.items())),
            "step_count_problems": self.count_problems[:MAX_REPORTED_PROBLEMS],
        }
