"""The ``--afd-*`` options: resolution (CLI > environment > ini > default; the specs are in
:mod:`pytest_afd.run.option_specs`) and checks, so a bad value fails at start-up
with a usage error naming the value and where it came from. See ``docs/plugin.md``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_afd.backends.model_fit import fit_errors, session_shapes
from pytest_afd.core.backend import RunSettings
from pytest_afd.results.directory import OutputDirError, check_writable_dir
from pytest_afd.run.option_specs import (  # noqa: F401  (re-exported)
    DEFAULT_GOLDEN_DIR,
    DEFAULT_MAX_SEQUENTIAL_REPEATS,
    DEFAULT_RESULTS_DIR,
    DEFAULT_SOAK_FORWARDS,
    MAX_DEVICES_PER_NODE,
    MAX_REPEATS,
    MAX_SEED,
    MAX_WARMUPS,
    MODEL_CHOICES,
    OPTION_SPECS,
    ROUTING_CHOICES,
    OptionSpec,
    add_options,
)
from pytest_afd.stats.repetitions import RepeatedRun, run_repeated
from pytest_afd.stats.sequential import SequentialDesign
from pytest_afd.study.document import StudyError, load_study
from pytest_afd.topology.spec import (
    Topology,
    TopologyError,
    load_aliases,
    parse_topology,
)
from pytest_afd.workloads.scale import DEFAULT_STAGE_SCALES, FULL_SCALE

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")
# Longer digit strings are refused before int() (which gives up past 4,300 digits).
MAX_INT_DIGITS = 20
_INT_PATTERN = re.compile(r"[+-]?[0-9]+")


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
    # Stage suites: the factor on the RFC's logical sizes (--afd-stage-scale or the backend's default).
    stage_scale: float = FULL_SCALE
    aliases: Mapping[str, str] = field(default_factory=dict)
    peer_timeout_s: int | None = None  # None: the AFD runtime's default
    # --afd-require-hardware is met by cases on a stand-in CPU server (labelled emulated).
    allow_emulated: bool = False
    # --afd-devices-per-node given (flag, env or ini), not its default: a hardware backend
    # plans with it; a default is never a fact about the nodes.
    devices_per_node_given: bool = False
    # --afd-sequential: comparisons measured until decided, from `repeats` to `max_repeats`.
    sequential: bool = False
    max_repeats: int = DEFAULT_MAX_SEQUENTIAL_REPEATS
    # --afd-study: the loaded, digest-checked study (pytest_afd.study), None without one.
    study: Mapping[str, Any] | None = None
    # --afd-soak-forwards: gate 5's soak length (the nightly passes a longer one).
    soak_forwards: int = DEFAULT_SOAK_FORWARDS

    def given_devices_per_node(self) -> int | None:
        """The nodes' NPU count the user gave, or None (the backend finds it or refuses)."""
        return self.devices_per_node if self.devices_per_node_given else None

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
            # Not "sequential": the result schema's protocol.sequential is the measured record.
            **({"repetitions_rule": "sequential", "max_repetitions": self.max_repeats}
               if self.sequential else {}),
            "instrumented": self.profile,
            "routing": self.routing,
        }

    def repeat(self, cases: Mapping[str, Callable[[], Any]], **overrides: Any) -> RepeatedRun:
        """:func:`pytest_afd.stats.repetitions.run_repeated` with the session's repeats/warmups/order/seed."""
        kwargs = {
            "repetitions": self.repeats,
            "warmups": self.warmups,
            "run_order": self.run_order,
            "seed": self.seed,
        }
        return run_repeated(cases, **{**kwargs, **overrides})

    def sequential_design(self) -> SequentialDesign:
        """The stopping rule of ``--afd-sequential`` (first look at ``repeats``)."""
        return SequentialDesign(min_repetitions=self.repeats, max_repetitions=self.max_repeats)


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


def parse_scale(text: str, source: str) -> float:
    """A factor in (0, 1], given as a float or a fraction like ``1/64``."""
    try:
        numerator, _, denominator = text.partition("/")
        value = float(numerator) / float(denominator) if denominator else float(numerator)
    except (ValueError, ZeroDivisionError):
        raise pytest.UsageError(f"{source}={text!r}: expected a number like 0.5 or 1/64") from None
    if not (math.isfinite(value) and 0 < value <= FULL_SCALE):
        raise pytest.UsageError(f"{source}={text!r}: expected a factor in (0, 1]")
    return value


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
    if spec.kind == "scale":
        return parse_scale(text, source)
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


def _check_model_fit(topology: Topology, values: dict[str, Any], sources: dict[str, str]) -> None:
    """Experts over EP ranks, heads over TP: a layout the model cannot take never starts."""
    errors = fit_errors(topology, session_shapes(values["afd_backend"], values["afd_model"]))
    if errors:
        raise pytest.UsageError(
            f"{sources['npu_topology']}={values['npu_topology']!r} does not fit the model "
            f"({sources['afd_model']}={values['afd_model']!r}, {sources['afd_backend']}="
            f"{values['afd_backend']!r}): {'; '.join(errors)}"
        )


def _check_output_dirs(values: dict[str, Any], sources: dict[str, str]) -> None:
    """The results dir (and the golden dir when goldens are rewritten) must be writable now."""
    dests = ["afd_results_dir", *(["afd_golden_dir"] if values["afd_update_golden"] else [])]
    for dest in dests:
        try:
            check_writable_dir(values[dest], sources[dest])
        except OutputDirError as exc:
            raise pytest.UsageError(str(exc)) from None


def _study(values: dict[str, Any], sources: dict[str, str]) -> Mapping[str, Any] | None:
    """The --afd-study file, schema- and digest-checked now (a bad study is a usage error)."""
    if values["afd_study"] is None:
        return None
    try:
        return load_study(values["afd_study"])
    except StudyError as exc:
        raise pytest.UsageError(f"{sources['afd_study']}: {exc}") from None


def resolve_options(config: pytest.Config) -> AfdOptions:
    """Read and check every ``--afd-*`` option; a bad value is a UsageError naming it and its source."""
    rootdir = Path(config.rootpath)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for spec in OPTION_SPECS:
        raw, sources[spec.dest] = _raw_option(config, spec)
        values[spec.dest] = _convert(spec, raw, sources[spec.dest], rootdir)
    topology, aliases = _topology(values, sources)
    _check_model_fit(topology, values, sources)
    _check_output_dirs(values, sources)
    if values["afd_peer_timeout_s"] is not None and values["afd_backend"] != "cpu":
        raise pytest.UsageError(
            f"{sources['afd_peer_timeout_s']}={values['afd_peer_timeout_s']}: the peer timeout "
            f"is the CPU AFD runtime's; --afd-backend is {values['afd_backend']!r}")
    if values["afd_sequential"] and values["afd_max_repeats"] < values["afd_repeats"]:
        raise pytest.UsageError(
            f"{sources['afd_max_repeats']}={values['afd_max_repeats']} is below "
            f"{sources['afd_repeats']}={values['afd_repeats']}: the most repetitions must be at "
            "least the first look")
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
        stage_scale=(
            values["afd_stage_scale"]
            if values["afd_stage_scale"] is not None
            else DEFAULT_STAGE_SCALES.get(values["afd_backend"], FULL_SCALE)
        ),
        aliases=aliases,
        topology=topology,
        peer_timeout_s=values["afd_peer_timeout_s"],
        allow_emulated=values["afd_allow_emulated"],
        devices_per_node_given=not sources["afd_devices_per_node"].endswith(" default"),
        sequential=values["afd_sequential"],
        max_repeats=values["afd_max_repeats"],
        study=_study(values, sources),
        soak_forwards=values["afd_soak_forwards"],
    )
