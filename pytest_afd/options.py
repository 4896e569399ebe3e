"""The ``--afd-*`` options: specs (flag, ini key, env variable, default), resolution
(CLI > environment > ini > default) and checks, so a bad value fails at start-up
with a usage error naming the value and where it came from. See ``docs/plugin.md``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_afd.backends import BACKEND_NAMES
from pytest_afd.backends.base import RunSettings
from pytest_afd.results_dir import OutputDirError, check_writable_dir
from pytest_afd.stats import MIN_REPETITIONS, RUN_ORDERS, RepeatedRun, run_repeated
from pytest_afd.topology import (
    DEFAULT_CPU_TOPOLOGY,
    DEFAULT_DEVICES_PER_NODE,
    MAX_TOTAL_RANKS,
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
    """One ``--afd-*`` option with its ini key and, where CI needs it, an env variable.

    ``help`` is plain text: ``--help`` appends the default, the env variable and
    the ini key. Integers are checked against ``[minimum, maximum]``.
    """

    flag: str
    dest: str
    help: str
    default: Any = None
    kind: str = "str"  # "str", "int", "bool", "path"
    choices: tuple[str, ...] | None = None
    env: str | None = None
    minimum: int | None = None
    maximum: int | None = None

    @property
    def ini(self) -> str:
        """ini keys all carry the ``afd_`` prefix (``afd_npu_topology``)."""
        return self.dest if self.dest.startswith("afd_") else f"afd_{self.dest}"

    @property
    def default_text(self) -> str | None:
        """The default as ``--help`` shows it (paths are relative to the rootdir)."""
        if self.default is None:
            return None
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
MAX_SEED = 2**32 - 1
MAX_DEVICES_PER_NODE = 64
MAX_PEER_TIMEOUT_S = 86_400
# Longer digit strings are refused before int() (which gives up past 4,300 digits).
MAX_INT_DIGITS = 20
_INT_PATTERN = re.compile(r"[+-]?[0-9]+")

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
        "--afd-devices-per-node",
        "afd_devices_per_node",
        f"NPUs per node for node counts and the rank layout, 1 to {MAX_DEVICES_PER_NODE}",
        DEFAULT_DEVICES_PER_NODE,
        kind="int",
        env="AFD_DEVICES_PER_NODE",
        minimum=1,
        maximum=MAX_DEVICES_PER_NODE,
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
    peer_timeout_s: int | None = None  # None: the AFD runtime's default

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
    """The first value given by CLI, environment or ini file, and where it came from.

    An empty environment variable or ini value counts as unset; an empty CLI
    value is an error (see :func:`_convert`), never the default in disguise.
    """
    cli = config.getoption(spec.dest)
    if cli is not None:
        return cli, spec.flag
    if spec.env and os.environ.get(spec.env, "") != "":
        return os.environ[spec.env], f"${spec.env}"
    ini = config.getini(spec.ini)
    if ini not in (None, "", []):
        return ini, f"ini {spec.ini}"
    return spec.default, f"{spec.flag} default"


def _convert_int(spec: OptionSpec, value: Any, source: str) -> int:
    text = str(value).strip()
    if len(text) > MAX_INT_DIGITS or not _INT_PATTERN.fullmatch(text):
        shown = text if len(text) <= MAX_INT_DIGITS else f"{text[:MAX_INT_DIGITS]}..."
        raise pytest.UsageError(f"{source}={shown!r}: expected an integer (ASCII digits)")
    number = int(text)
    if spec.minimum is not None and number < spec.minimum:
        raise pytest.UsageError(
            f"{source}={number}: expected at least {spec.minimum} ({spec.help})"
        )
    if spec.maximum is not None and number > spec.maximum:
        raise pytest.UsageError(f"{source}={number}: expected at most {spec.maximum} ({spec.help})")
    return number


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
        return _convert_int(spec, value, source)
    text = str(value).strip()
    if not text:
        default = f"the default {spec.default_text}" if spec.default_text else "no value"
        raise pytest.UsageError(
            f"{source}={value!r}: empty; give a value or leave the option out for {default}"
        )
    if spec.choices is not None and text not in spec.choices:
        raise pytest.UsageError(f"{source}={text!r}: expected one of {', '.join(spec.choices)}")
    if spec.kind == "path":
        path = Path(text).expanduser()
        return path if path.is_absolute() else rootdir / path
    return text


def _topology(values: dict[str, Any], sources: dict[str, str]) -> tuple[Topology, dict[str, str]]:
    """Parse the topology (and the alias file first); errors name the option they came from."""
    aliases_path = values["afd_topology_aliases"]
    try:
        aliases = load_aliases(aliases_path) if aliases_path is not None else {}
    except TopologyError as exc:
        raise pytest.UsageError(f"{sources['afd_topology_aliases']}: {exc}") from None
    try:
        return parse_topology(values["npu_topology"], aliases), aliases
    except TopologyError as exc:
        raise pytest.UsageError(f"{sources['npu_topology']}: {exc}") from None


def _check_output_dirs(values: dict[str, Any], sources: dict[str, str]) -> None:
    """The results dir (and the golden dir when goldens are rewritten) must be writable now."""
    dests = ["afd_results_dir", *(["afd_golden_dir"] if values["afd_update_golden"] else [])]
    for dest in dests:
        try:
            check_writable_dir(values[dest], sources[dest])
        except OutputDirError as exc:
            raise pytest.UsageError(str(exc)) from None


def resolve_options(config: pytest.Config) -> AfdOptions:
    """Read and check every ``--afd-*`` option; a bad value is a UsageError naming it and its source."""
    rootdir = Path(config.rootpath)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for spec in OPTION_SPECS:
        raw, sources[spec.dest] = _raw_option(config, spec)
        values[spec.dest] = _convert(spec, raw, sources[spec.dest], rootdir)
    topology, aliases = _topology(values, sources)
    _check_output_dirs(values, sources)
    if values["afd_peer_timeout_s"] is not None and values["afd_backend"] != "cpu":
        raise pytest.UsageError(
            f"{sources['afd_peer_timeout_s']}={values['afd_peer_timeout_s']}: the peer timeout "
            f"is the CPU AFD runtime's; --afd-backend is {values['afd_backend']!r}")
    return AfdOptions(
        topology_spec=values["npu_topology"],
        backend=values["afd_backend"],
        model=values["afd_model"],
        routing=ROUTING_CHOICES[values["afd_routing"]],
        results_dir=values["afd_results_dir"],
        repeats=values["afd_repeats"],
        warmups=values["afd_warmups"],
        seed=values["afd_seed"],
        run_order=values["afd_run_order"],
        profile=values["afd_profile"],
        cpu_processes=values["afd_cpu_processes"],
        golden_dir=values["afd_golden_dir"],
        update_golden=values["afd_update_golden"],
        require_hardware=values["afd_require_hardware"],
        devices_per_node=values["afd_devices_per_node"],
        aliases=aliases,
        topology=topology,
        peer_timeout_s=values["afd_peer_timeout_s"],
    )


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
