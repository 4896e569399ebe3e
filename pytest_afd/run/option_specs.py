"""The ``--afd-*`` option specs (flag, ini key, env variable, default) and their registration
with pytest's parser. Resolution and checks live in :mod:`pytest_afd.run.options`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pytest_afd.backends import BACKEND_NAMES
from pytest_afd.stats.repetitions import MIN_REPETITIONS, RUN_ORDERS
from pytest_afd.topology.spec import (
    DEFAULT_CPU_TOPOLOGY,
    DEFAULT_DEVICES_PER_NODE,
    MAX_TOTAL_RANKS,
)

# --afd-routing names the CLI value; RunSettings uses the backend protocol's name.
ROUTING_CHOICES = {"natural": "natural", "forced": "forced_balanced"}
MODEL_CHOICES = ("reduced", "full")
DEFAULT_RESULTS_DIR = "afd-results"
DEFAULT_GOLDEN_DIR = "golden"


@dataclass(frozen=True)
class OptionSpec:
    """One ``--afd-*`` option with its ini key and, where CI needs it, an env variable.

    ``help`` is plain text: ``--help`` appends the default, the env variable and
    the ini key. Integers are checked against ``[minimum, maximum]``.
    """

    flag: str
    dest: str
    help: str
    default: Any = None
    kind: str = "str"  # "str", "int", "bool", "path", "scale"
    choices: tuple[str, ...] | None = None
    env: str | None = None
    minimum: int | None = None
    maximum: int | None = None
    # --help's default where it depends on other options (the stage scale on the backend).
    default_note: str | None = None

    @property
    def ini(self) -> str:
        """ini keys all carry the ``afd_`` prefix (``afd_npu_topology``)."""
        return self.dest if self.dest.startswith("afd_") else f"afd_{self.dest}"

    @property
    def default_text(self) -> str | None:
        """The default as ``--help`` shows it (paths are relative to the rootdir)."""
        if self.default is None:
            return self.default_note
        if self.kind == "bool":
            return "on" if self.default else "off"
        if self.kind == "path":
            return f"<rootdir>/{self.default}"
        return str(self.default)

    def help_text(self) -> str:
        notes = [f"default: {self.default_text}"] if self.default_text is not None else []
        if self.env:
            notes.append(f"env {self.env}")
        notes.append(f"ini {self.ini}")
        return f"{self.help} ({'; '.join(notes)})"


# Upper bounds: far past any study, low enough that a typo fails at start-up
# instead of running for hours (seeds: numpy's legacy 32-bit seed range).
MAX_REPEATS = 1000
MAX_WARMUPS = 100
DEFAULT_MAX_SEQUENTIAL_REPEATS = 16
"""``--afd-max-repeats``'s default (pytest_afd.stats.sequential's last planned look)."""
MAX_SEED = 2**32 - 1
MAX_DEVICES_PER_NODE = 64
MAX_PEER_TIMEOUT_S = 86_400
MIN_SOAK_FORWARDS = DEFAULT_SOAK_FORWARDS = 250
"""The pre-merge soak, and the shortest: its gc bound (100 objects, against a clean growth
of -2..1) still sees one tracked object kept per forward at 2.5x the bound (a gate test
checks it at the length given) and its block bound (2,048) ~8 a forward (a forward's kept
metadata is ~15); the nightly runs 5,000 (docs/gates.md)."""
MAX_SOAK_FORWARDS = 1_000_000

OPTION_SPECS = (
    OptionSpec(
        "--npu-topology",
        "npu_topology",
        f"topology string or alias, e.g. dp3pcp8-ep8; the default is the recipe's AFD layout; "
        f"at most {MAX_TOTAL_RANKS} ranks",
        DEFAULT_CPU_TOPOLOGY,
        env="AFD_NPU_TOPOLOGY",
    ),
    OptionSpec(
        "--afd-topology-aliases",
        "afd_topology_aliases",
        "YAML file mapping alias -> topology, added to the built-in aliases",
        kind="path",
        env="AFD_TOPOLOGY_ALIASES",
    ),
    OptionSpec(
        "--afd-backend",
        "afd_backend",
        "backend to run",
        "cpu",
        choices=BACKEND_NAMES,
        env="AFD_BACKEND",
    ),
    OptionSpec(
        "--afd-model",
        "afd_model",
        "model config: reduced (small, seeded) or full (the whole DeepSeek V3.2 shape)",
        "reduced",
        choices=MODEL_CHOICES,
        env="AFD_MODEL",
    ),
    OptionSpec(
        "--afd-routing",
        "afd_routing",
        "expert routing: natural, or forced (forced-balanced, labelled synthetic)",
        "natural",
        choices=tuple(ROUTING_CHOICES),
        env="AFD_ROUTING",
    ),
    OptionSpec(
        "--afd-results-dir",
        "afd_results_dir",
        "where result JSON goes; checked writable at start-up",
        DEFAULT_RESULTS_DIR,
        kind="path",
        env="AFD_RESULTS_DIR",
    ),
    OptionSpec(
        "--afd-repeats",
        "afd_repeats",
        f"measured repetitions per case, {MIN_REPETITIONS} to {MAX_REPEATS}",
        MIN_REPETITIONS,
        kind="int",
        env="AFD_REPEATS",
        minimum=MIN_REPETITIONS,
        maximum=MAX_REPEATS,
    ),
    OptionSpec(
        "--afd-sequential",
        "afd_sequential",
        "sequential repetitions: measure each comparison from --afd-repeats on until its "
        "interval decides it or --afd-max-repeats is reached (docs/stages.md); off: every "
        "case gets exactly --afd-repeats (the headline protocol)",
        False,
        kind="bool",
        env="AFD_SEQUENTIAL",
    ),
    OptionSpec(
        "--afd-max-repeats",
        "afd_max_repeats",
        f"with --afd-sequential: the most measured repetitions per case, >= --afd-repeats, "
        f"at most {MAX_REPEATS}",
        DEFAULT_MAX_SEQUENTIAL_REPEATS,
        kind="int",
        env="AFD_MAX_REPEATS",
        minimum=MIN_REPETITIONS,
        maximum=MAX_REPEATS,
    ),
    OptionSpec(
        "--afd-soak-forwards",
        "afd_soak_forwards",
        f"forwards of gate 5's soak, {MIN_SOAK_FORWARDS} to {MAX_SOAK_FORWARDS}: its bounds "
        "see objects kept per forward from ~400/N tracked and ~2,048/N small ones a "
        "forward (docs/gates.md; the nightly runs 5,000)",
        DEFAULT_SOAK_FORWARDS,
        kind="int",
        env="AFD_SOAK_FORWARDS",
        minimum=MIN_SOAK_FORWARDS,
        maximum=MAX_SOAK_FORWARDS,
    ),
    OptionSpec(
        "--afd-warmups",
        "afd_warmups",
        f"unmeasured warmup runs per case, 0 to {MAX_WARMUPS}",
        1,
        kind="int",
        env="AFD_WARMUPS",
        minimum=0,
        maximum=MAX_WARMUPS,
    ),
    OptionSpec(
        "--afd-seed",
        "afd_seed",
        f"seed for workloads and run order, 0 to {MAX_SEED}",
        0,
        kind="int",
        env="AFD_SEED",
        minimum=0,
        maximum=MAX_SEED,
    ),
    OptionSpec(
        "--afd-run-order",
        "afd_run_order",
        "order of measured repetitions across the cases of one comparison",
        "interleaved",
        choices=RUN_ORDERS,
        env="AFD_RUN_ORDER",
    ),
    OptionSpec(
        "--afd-profile",
        "afd_profile",
        "instrumented runs (per-layer timings; not for headline numbers)",
        False,
        kind="bool",
        env="AFD_PROFILE",
    ),
    OptionSpec(
        "--afd-cpu-processes",
        "afd_cpu_processes",
        "CPU backend: run Attention and FFN roles as separate processes (AFD runtime)",
        False,
        kind="bool",
        env="AFD_CPU_PROCESSES",
    ),
    OptionSpec(
        "--afd-peer-timeout-s",
        "afd_peer_timeout_s",
        "CPU AFD runtime (--afd-cpu-processes, afd_processes servers): seconds a rank waits "
        f"for its peer before the step fails, 1 to {MAX_PEER_TIMEOUT_S}; unset: the "
        "runtime's 120 s",
        kind="int",
        env="AFD_PEER_TIMEOUT_S",
        minimum=1,
        maximum=MAX_PEER_TIMEOUT_S,
    ),
    OptionSpec(
        "--afd-golden-dir",
        "afd_golden_dir",
        "golden outputs directory",
        DEFAULT_GOLDEN_DIR,
        kind="path",
        env="AFD_GOLDEN_DIR",
    ),
    OptionSpec(
        "--afd-update-golden",
        "afd_update_golden",
        "rewrite goldens from this run (atomically)",
        False,
        kind="bool",
    ),
    OptionSpec(
        "--afd-require-hardware",
        "afd_require_hardware",
        "fail instead of skip when the backend or the devices a test needs are missing",
        False,
        kind="bool",
        env="AFD_REQUIRE_HARDWARE",
    ),
    OptionSpec(
        "--afd-allow-emulated",
        "afd_allow_emulated",
        "with --afd-require-hardware: cases run on a pytest-afd CPU server standing in for the "
        "deployment satisfy the requirement (CPU rehearsals); they are still counted and "
        "labelled emulated, never as hardware",
        False,
        kind="bool",
        env="AFD_ALLOW_EMULATED",
    ),
    OptionSpec(
        "--afd-devices-per-node",
        "afd_devices_per_node",
        f"NPUs per node for node counts and the rank layout, 1 to {MAX_DEVICES_PER_NODE}",
        DEFAULT_DEVICES_PER_NODE,
        kind="int",
        env="AFD_DEVICES_PER_NODE",
        minimum=1,
        maximum=MAX_DEVICES_PER_NODE,
    ),
    OptionSpec(
        "--afd-stage-scale",
        "afd_stage_scale",
        "stage suites: factor in (0, 1] on the RFC's logical sizes (tokens, blocks, budgets), "
        "a number like 0.5 or a fraction like 1/64",
        kind="scale",
        env="AFD_STAGE_SCALE",
        default_note="1/64 on the cpu backend, 1 otherwise",
    ),
    OptionSpec(
        "--afd-study",
        "afd_study",
        "a frozen study JSON (docs/study.md): every case's manifest records its name and "
        "digest, a case whose stack, topology, model or tolerances contradict it fails before "
        "it measures, and stages B-E use its reference cases",
        kind="path",
        env="AFD_STUDY",
    ),
)


def value_flags(extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The flags that take a value (every non-bool spec, plus ``extra``)."""
    return tuple(spec.flag for spec in OPTION_SPECS if spec.kind != "bool") + extra


def add_options(parser: pytest.Parser) -> pytest.OptionGroup:
    """Register every option of ``OPTION_SPECS`` with its ini key; returns the ``afd`` group
    (the ``pytest_addoption`` body: other modules add their options to the same group)."""
    group = parser.getgroup("afd", "pytest-afd: AFD prefill harness (topology, backend, results)")
    for spec in OPTION_SPECS:
        if spec.kind == "bool":
            group.addoption(
                spec.flag, dest=spec.dest, action="store_true", default=None, help=spec.help_text()
            )
            parser.addini(spec.ini, spec.help, type="bool", default=None)
            continue
        # Values stay strings here so CLI, env and ini go through one conversion (_convert).
        group.addoption(
            spec.flag, dest=spec.dest, default=None, choices=spec.choices, help=spec.help_text()
        )
        parser.addini(spec.ini, spec.help, default=None)
    return group
