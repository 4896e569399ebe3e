"""The ``--afd-*`` options: specs (flag, ini key, env variable, default), resolution
(CLI > environment > ini > default) and checks, so a bad value fails at start-up
with a usage error naming the value and where it came from. See ``docs/plugin.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_afd.backends import BACKEND_NAMES
from pytest_afd.backends.base import RunSettings
from pytest_afd.stats import MIN_REPETITIONS, RUN_ORDERS, RepeatedRun, run_repeated
from pytest_afd.topology import (
    DEFAULT_CPU_TOPOLOGY,
    DEFAULT_DEVICES_PER_NODE,
    Topology,
    TopologyError,
    load_aliases,
    parse_topology,
)

# --afd-routing names the CLI value; RunSettings uses the backend protocol's name.
ROUTING_CHOICES = {"natural": "natural", "forced": "forced_balanced"}
MODEL_CHOICES = ("reduced", "full")
DEFAULT_RESULTS_DIR = "afd-results"
DEFAULT_GOLDEN_DIR = "golden"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class OptionSpec:
    """One ``--afd-*`` option with its ini key and, where CI needs it, an env variable."""

    flag: str
    dest: str
    help: str
    default: Any = None
    kind: str = "str"  # "str", "int", "bool", "path"
    choices: tuple[str, ...] | None = None
    env: str | None = None

    @property
    def ini(self) -> str:
        """ini keys all carry the ``afd_`` prefix (``afd_npu_topology``)."""
        return self.dest if self.dest.startswith("afd_") else f"afd_{self.dest}"


OPTION_SPECS = (
    OptionSpec(
        "--npu-topology",
        "npu_topology",
        f"topology string or alias, e.g. dp3pcp8-ep8 (default {DEFAULT_CPU_TOPOLOGY}, the recipe's AFD layout)",
        env="AFD_NPU_TOPOLOGY",
    ),
    OptionSpec(
        "--afd-topology-aliases",
        "afd_topology_aliases",
        "YAML file mapping alias -> topology",
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
        "model config",
        "reduced",
        choices=MODEL_CHOICES,
        env="AFD_MODEL",
    ),
    OptionSpec(
        "--afd-routing",
        "afd_routing",
        "expert routing (forced = forced-balanced, synthetic)",
        "natural",
        choices=tuple(ROUTING_CHOICES),
        env="AFD_ROUTING",
    ),
    OptionSpec(
        "--afd-results-dir",
        "afd_results_dir",
        f"where result JSON goes (default <rootdir>/{DEFAULT_RESULTS_DIR})",
        kind="path",
        env="AFD_RESULTS_DIR",
    ),
    OptionSpec(
        "--afd-repeats",
        "afd_repeats",
        f"measured repetitions (>= {MIN_REPETITIONS})",
        MIN_REPETITIONS,
        kind="int",
        env="AFD_REPEATS",
    ),
    OptionSpec(
        "--afd-warmups", "afd_warmups", "warmup runs per case", 1, kind="int", env="AFD_WARMUPS"
    ),
    OptionSpec(
        "--afd-seed", "afd_seed", "seed for workloads and run order", 0, kind="int", env="AFD_SEED"
    ),
    OptionSpec(
        "--afd-run-order",
        "afd_run_order",
        "order of measured repetitions",
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
        "--afd-golden-dir",
        "afd_golden_dir",
        f"golden outputs directory (default <rootdir>/{DEFAULT_GOLDEN_DIR})",
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
        "--afd-devices-per-node",
        "afd_devices_per_node",
        f"NPUs per node for node counts and the rank layout (default {DEFAULT_DEVICES_PER_NODE})",
        DEFAULT_DEVICES_PER_NODE,
        kind="int",
        env="AFD_DEVICES_PER_NODE",
    ),
)


@dataclass(frozen=True)
class AfdOptions:
    """Resolved options (CLI > environment > ini > default); the ``afd_options`` fixture."""

    topology_spec: str
    backend: str
    model: str
    routing: str  # RunSettings' name: "natural" or "forced_balanced"
    results_dir: Path
    repeats: int
    warmups: int
    seed: int
    run_order: str
    profile: bool
    cpu_processes: bool
    golden_dir: Path
    update_golden: bool
    require_hardware: bool
    devices_per_node: int
    topology: Topology
    aliases: Mapping[str, str] = field(default_factory=dict)

    def run_settings(self, **overrides: Any) -> RunSettings:
        """RunSettings defaults from the options (routing, profile, split constraints), then overrides."""
        emulation = self.topology.cpu_emulation()
        defaults = {
            "routing": self.routing,
            "instrument": self.profile,
            "afd_processes": self.cpu_processes,
            "split_align": emulation.split_align,
            "pcp_size": emulation.pcp_size,
        }
        return RunSettings(**{**defaults, **overrides})

    def protocol(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "warmups": self.warmups,
            "repetitions": self.repeats,
            "run_order": self.run_order,
            "instrumented": self.profile,
            "routing": self.routing,
        }

    def repeat(self, cases: Mapping[str, Callable[[], Any]], **overrides: Any) -> RepeatedRun:
        """:func:`pytest_afd.stats.run_repeated` with the session's repeats/warmups/order/seed."""
        kwargs = {
            "repetitions": self.repeats,
            "warmups": self.warmups,
            "run_order": self.run_order,
            "seed": self.seed,
        }
        return run_repeated(cases, **{**kwargs, **overrides})


def _raw_option(config: pytest.Config, spec: OptionSpec) -> tuple[Any, str]:
    """The first value given by CLI, environment or ini file, and where it came from."""
    cli = config.getoption(spec.dest)
    if cli is not None:
        return cli, spec.flag
    if spec.env and os.environ.get(spec.env, "") != "":
        return os.environ[spec.env], f"${spec.env}"
    ini = config.getini(spec.ini)
    if ini not in (None, "", []):
        return ini, f"ini {spec.ini}"
    return spec.default, f"{spec.flag} default"


def _convert(spec: OptionSpec, value: Any, source: str, rootdir: Path) -> Any:
    if value is None:
        return None
    if spec.kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text not in TRUE_WORDS + FALSE_WORDS:
            raise pytest.UsageError(
                f"{source}={value!r}: expected a boolean ({'/'.join(TRUE_WORDS)})"
            )
        return text in TRUE_WORDS
    if spec.kind == "int":
        try:
            return int(value)
        except (TypeError, ValueError):
            raise pytest.UsageError(f"{source}={value!r}: expected an integer") from None
    text = str(value).strip()
    if spec.choices is not None and text not in spec.choices:
        raise pytest.UsageError(f"{source}={text!r}: expected one of {', '.join(spec.choices)}")
    if spec.kind == "path":
        path = Path(text).expanduser()
        return path if path.is_absolute() else rootdir / path
    return text


def resolve_options(config: pytest.Config) -> AfdOptions:
    """Read and check every ``--afd-*`` option; a bad value is a UsageError naming it."""
    rootdir = Path(config.rootpath)
    values: dict[str, Any] = {}
    for spec in OPTION_SPECS:
        raw, source = _raw_option(config, spec)
        values[spec.dest] = _convert(spec, raw, source, rootdir)
    checks = (
        ("afd_repeats", MIN_REPETITIONS, f"at least {MIN_REPETITIONS} measured repetitions (RFC)"),
        ("afd_warmups", 0, "a non-negative warmup count"),
        ("afd_devices_per_node", 1, "at least one device per node"),
    )
    for dest, minimum, why in checks:
        if values[dest] < minimum:
            raise pytest.UsageError(f"--{dest.replace('_', '-')}={values[dest]}: expected {why}")
    aliases_path = values["afd_topology_aliases"]
    spec_text = values["npu_topology"] or DEFAULT_CPU_TOPOLOGY
    try:
        aliases = load_aliases(aliases_path) if aliases_path is not None else {}
        topology = parse_topology(spec_text, aliases)
    except TopologyError as exc:
        raise pytest.UsageError(f"--npu-topology: {exc}") from None
    return AfdOptions(
        topology_spec=spec_text,
        backend=values["afd_backend"],
        model=values["afd_model"],
        routing=ROUTING_CHOICES[values["afd_routing"]],
        results_dir=values["afd_results_dir"] or rootdir / DEFAULT_RESULTS_DIR,
        repeats=values["afd_repeats"],
        warmups=values["afd_warmups"],
        seed=values["afd_seed"],
        run_order=values["afd_run_order"],
        profile=values["afd_profile"],
        cpu_processes=values["afd_cpu_processes"],
        golden_dir=values["afd_golden_dir"] or rootdir / DEFAULT_GOLDEN_DIR,
        update_golden=values["afd_update_golden"],
        require_hardware=values["afd_require_hardware"],
        devices_per_node=values["afd_devices_per_node"],
        aliases=aliases,
        topology=topology,
    )


def add_options(parser: pytest.Parser) -> None:
    """Register every option of ``OPTION_SPECS`` with its ini key (the ``pytest_addoption`` body)."""
    group = parser.getgroup("afd", "pytest-afd: AFD prefill harness (topology, backend, results)")
    for spec in OPTION_SPECS:
        env_note = f" [env {spec.env}]" if spec.env else ""
        if spec.kind == "bool":
            group.addoption(
                spec.flag,
                dest=spec.dest,
                action="store_true",
                default=None,
                help=spec.help + env_note,
            )
            parser.addini(spec.ini, spec.help, type="bool", default=None)
            continue
        group.addoption(
            spec.flag,
            dest=spec.dest,
            default=None,
            choices=spec.choices,
            type=int if spec.kind == "int" else str,
            help=f"{spec.help}{env_note}",
        )
        parser.addini(spec.ini, spec.help, default=None)
