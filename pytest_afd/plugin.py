"""pytest plugin entry point (registered through the ``pytest11`` entry point).

Options (group ``afd``), markers, fixtures (``npu_topology``, ``rank_layout``,
``afd_backend``, ``afd_options``, ``afd_manifest``, ``golden``,
``afd_results``), hardware-marker skips, per-worker result collection merged
under pytest-xdist, and the terminal summary. See ``docs/plugin.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_afd import hookspecs, outcomes
from pytest_afd.backends import BACKEND_NAMES, create_backend
from pytest_afd.backends.base import Backend, BackendUnavailable, RunSettings
from pytest_afd.golden import GoldenStore
from pytest_afd.manifest import collect_manifest, manifest_digest
from pytest_afd.markers import MARKER_SIGNATURES, MARKERS
from pytest_afd.results import (
    CASE_KINDS,
    ResultValidationError,
    build_result,
    headline,
    result_path,
    validate_manifest,
    write_result,
)
from pytest_afd.stats import MIN_REPETITIONS, RUN_ORDERS, RepeatedRun, run_repeated
from pytest_afd.topology import (
    DEFAULT_CPU_TOPOLOGY,
    DEFAULT_DEVICES_PER_NODE,
    RankInfo,
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
SUMMARY_FILE = "summary.json"
WORKEROUTPUT_KEY = "afd_results"
AFD_SESSION_PLUGIN = "afd-session"
ENV_NUM_NODES = "AFD_NUM_NODES"
DEFAULT_NUM_NODES = 1
# Marker defaults: npu() alone means one NPU, multi_node() alone means two nodes.
DEFAULT_NPU_DEVICES = 1
DEFAULT_MULTI_NODE_NODES = 2
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


@dataclass(eq=False)  # identity-hashed: it is registered as a pytest plugin
class AfdSession:
    """Per-process plugin state (one per xdist worker), kept in ``config.stash``."""

    config: pytest.Config
    options: AfdOptions
    backend_instance: Backend | None = None
    backend_error: BackendUnavailable | None = None
    backend_tried: bool = False
    manifest_doc: dict[str, Any] | None = None
    written: list[dict[str, Any]] = field(default_factory=list)
    golden_updates: list[str] = field(default_factory=list)
    # Test outcome per node id (controller side under xdist: it sees every report).
    outcomes: dict[str, str] = field(default_factory=dict)

    @property
    def emulated(self) -> bool:
        return self.options.backend == "cpu"

    def backend(self) -> Backend:
        """Create the backend once per process; re-raise BackendUnavailable on every call."""
        if not self.backend_tried:
            opts = self.options
            try:
                backend = self.config.hook.pytest_afd_create_backend(
                    config=self.config,
                    name=opts.backend,
                    topology=opts.topology,
                    model_name=opts.model,
                    seed=opts.seed,
                    results_dir=opts.results_dir,
                )
                self.backend_instance = backend or create_backend(
                    opts.backend,
                    topology=opts.topology,
                    model_name=opts.model,
                    seed=opts.seed,
                    results_dir=opts.results_dir,
                )
            except BackendUnavailable as exc:
                self.backend_error = exc
            # Any other error propagates and the next caller tries again.
            self.backend_tried = True
        if self.backend_error is not None:
            raise self.backend_error
        return self.backend_instance

    def manifest(self) -> dict[str, Any]:
        if self.manifest_doc is None:
            description, reason = None, None
            try:
                description = self.backend().describe()
            except BackendUnavailable as exc:
                reason = f"backend {self.options.backend!r} unavailable: {exc}"
            manifest = collect_manifest(
                topology=self.options.topology,
                backend_name=self.options.backend,
                backend_description=description,
                backend_absent_reason=reason,
                model_name=self.options.model,
                protocol=self.options.protocol(),
                emulated=self.emulated,
                devices_per_node=self.options.devices_per_node,
            )
            self.config.hook.pytest_afd_manifest(config=self.config, manifest=manifest)
            manifest["digest"] = manifest_digest(manifest)
            validate_manifest(manifest)
            self.manifest_doc = manifest
        return self.manifest_doc

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Remember each test's outcome for the results table (setup/teardown failure = error)."""
        if report.when == "call":
            self.outcomes[report.nodeid] = report.outcome
        elif report.failed:
            self.outcomes[report.nodeid] = "error"

    def close(self) -> None:
        if self.backend_instance is not None:
            backend, self.backend_instance = self.backend_instance, None
            backend.close()


AFD_SESSION_KEY = pytest.StashKey[AfdSession]()


def afd_session(config: pytest.Config) -> AfdSession:
    return config.stash[AFD_SESSION_KEY]


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
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


def pytest_configure(config: pytest.Config) -> None:
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", f"{MARKER_SIGNATURES.get(name, name)}: {help_text}")
    state = AfdSession(config=config, options=resolve_options(config))
    config.stash[AFD_SESSION_KEY] = state
    # Registered as a plugin so it receives every test report (outcome column).
    config.pluginmanager.register(state, AFD_SESSION_PLUGIN)
    outcomes.register(config)


def pytest_report_header(config: pytest.Config) -> list[str]:
    opts = afd_session(config).options
    topo = opts.topology
    roles = (
        f"{topo.attention_ranks} Attention + {topo.ffn_ranks} FFN ranks, ratio {topo.ratio_label}"
        if topo.is_afd
        else f"{topo.attention_ranks} co-located ranks"
    )
    lines = [
        f"afd: backend={opts.backend} topology={topo.canonical} ({roles}, "
        f"{topo.nodes_needed(opts.devices_per_node)} nodes of {opts.devices_per_node}) "
        f"model={opts.model} routing={opts.routing} seed={opts.seed} repeats={opts.repeats} "
        f"warmups={opts.warmups} order={opts.run_order}"
    ]
    if opts.backend == "cpu":
        lines.append(f"afd: CPU emulation: {topo.cpu_emulation().note}")
    return lines


def _marker_count(marker: pytest.Mark, key: str, default: int) -> int:
    """``marker(key=N)`` or ``marker(N)`` as a positive int; anything else fails the test, naming it."""
    value = marker.kwargs.get(key, marker.args[0] if marker.args else default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise pytest.UsageError(
            f"@pytest.mark.{marker.name}({key}={value!r}): expected a positive int"
        )
    return value


def _available_nodes() -> int:
    text = os.environ.get(ENV_NUM_NODES, "").strip() or str(DEFAULT_NUM_NODES)
    if not text.isdigit() or int(text) < 1:
        pytest.fail(f"${ENV_NUM_NODES}={text!r}: expected a positive integer", pytrace=False)
    return int(text)


def _hardware_skip_reason(item: pytest.Item) -> str | None:
    npu = item.get_closest_marker("npu")
    if npu is not None:
        devices = _marker_count(npu, "devices", DEFAULT_NPU_DEVICES)
        soc = npu.kwargs.get("soc")
        available, found_soc, why = detect_npus()
        if available < devices:
            return f"needs {devices} NPU devices (npu marker), {available} available: {why}"
        if soc is not None and (found_soc is None or soc.lower() not in found_soc.lower()):
            return f"needs SoC {soc!r} (npu marker), found {found_soc!r}"
    multi = item.get_closest_marker("multi_node")
    if multi is not None:
        nodes = _marker_count(multi, "nodes", DEFAULT_MULTI_NODE_NODES)
        have = _available_nodes()
        if have < nodes:
            return f"needs {nodes} nodes (multi_node marker), {ENV_NUM_NODES}={have}"
    return None


def detect_npus() -> tuple[int, str | None, str]:
    """(device count, SoC name, explanation) without importing torch_npu when it is absent."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        return 0, None, "torch_npu is not installed"
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    count = torch.npu.device_count()
    if count == 0:
        return 0, None, "torch_npu found no NPU"
    return count, torch.npu.get_device_name(0), f"{count} NPU(s) visible"


def pytest_runtest_setup(item: pytest.Item) -> None:
    opts = afd_session(item.config).options
    reason = _hardware_skip_reason(item)
    if reason is None:
        return
    if opts.require_hardware:
        pytest.fail(f"--afd-require-hardware: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def afd_options(pytestconfig: pytest.Config) -> AfdOptions:
    """Resolved ``--afd-*`` options: ``run_settings(**overrides)``, ``repeat(cases)``, ``protocol()``."""
    return afd_session(pytestconfig).options


@pytest.fixture(scope="session")
def npu_topology(afd_options: AfdOptions) -> Topology:
    """The parsed ``--npu-topology`` (default ``dp3pcp8-ep8``)."""
    return afd_options.topology


@pytest.fixture(scope="session")
def rank_layout(npu_topology: Topology, afd_options: AfdOptions) -> list[RankInfo]:
    """Rank → node, device, role and DP/PCP/PP/group/EP indices."""
    return npu_topology.rank_layout(afd_options.devices_per_node)


@pytest.fixture(scope="session")
def afd_backend(pytestconfig: pytest.Config) -> Backend:
    """The session's backend; unavailable → skip with the reason (fail under --afd-require-hardware)."""
    state = afd_session(pytestconfig)
    try:
        return state.backend()
    except BackendUnavailable as exc:
        message = f"backend {state.options.backend!r} unavailable: {exc}"
        if state.options.require_hardware:
            pytest.fail(f"--afd-require-hardware: {message}", pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="session")
def afd_manifest(pytestconfig: pytest.Config) -> dict[str, Any]:
    """The session manifest (validated, with ``digest``)."""
    return afd_session(pytestconfig).manifest()


@pytest.fixture
def golden(pytestconfig: pytest.Config) -> GoldenStore:
    """``golden.check(name, value, profile=..., reference=None)`` against ``--afd-golden-dir``."""
    state = afd_session(pytestconfig)
    store = GoldenStore(
        directory=state.options.golden_dir,
        update=state.options.update_golden,
        manifest_digest=lambda: state.manifest()["digest"],
    )
    yield store
    state.golden_updates.extend(store.updated)


def case_kind(item: pytest.Item) -> str:
    """The first gate/stage marker on the test, else ``"other"``."""
    for kind in CASE_KINDS:
        if item.get_closest_marker(kind) is not None:
            return kind
    return "other"


@dataclass
class ResultWriter:
    """The ``afd_results`` fixture: one validated, atomically written result JSON per case."""

    state: AfdSession
    case_id: str
    case_kind: str
    written: list[str] = field(default_factory=list)

    @property
    def results_dir(self) -> Path:
        return self.state.options.results_dir

    def build(self, *, case_suffix: str | None = None, **kwargs: Any) -> dict[str, Any]:
        """:func:`pytest_afd.results.build_result` with case id, kind, backend, protocol and manifest filled in."""
        opts = self.state.options
        defaults = {
            "case_id": self.case_id if case_suffix is None else f"{self.case_id}/{case_suffix}",
            "case_kind": self.case_kind,
            "backend": opts.backend,
            "protocol": {
                k: v
                for k, v in opts.protocol().items()
                if k in ("seed", "warmups", "repetitions", "run_order")
            },
        }
        if "manifest" not in kwargs:
            defaults["manifest"] = self.state.manifest()
        return build_result(**{**defaults, **kwargs})

    def write(self, doc: dict[str, Any]) -> Path:
        """Validate and write ``doc``; an invalid result fails the test with the validation error."""
        if doc.get("case_id") in self.written:
            pytest.fail(
                f"result {doc['case_id']!r} written twice: one result per case", pytrace=False
            )
        path = result_path(self.results_dir, str(doc.get("case_id", self.case_id)))
        doc = outcomes.tracker(self.state.config).stamp(doc)
        try:
            write_result(path, doc)
        except ResultValidationError as exc:
            pytest.fail(str(exc), pytrace=False)
        self.written.append(doc["case_id"])
        metric, median, cv, unit = headline(doc)
        self.state.written.append(
            {
                "case_id": doc["case_id"],
                "nodeid": self.case_id,
                "case_kind": doc["case_kind"],
                "path": str(path),
                "metric": metric,
                "median": median,
                "cv": cv,
                "unit": unit,
                "synthetic": doc["labels"]["synthetic"],
                "comparability": doc["labels"]["comparability"],
                "manifest_digest": doc["manifest_digest"],
            }
        )
        self.state.config.hook.pytest_afd_result_written(
            config=self.state.config, path=path, result=doc
        )
        return path

    def record(self, **kwargs: Any) -> Path:
        """Build (see :meth:`build`) and write in one call."""
        return self.write(self.build(**kwargs))


@pytest.fixture
def afd_results(request: pytest.FixtureRequest) -> ResultWriter:
    """Writer for this case's result JSON (``record(...)``, or ``build(...)`` then ``write(doc)``)."""
    return ResultWriter(
        state=afd_session(request.config),
        case_id=request.node.nodeid,
        case_kind=case_kind(request.node),
    )


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = afd_session(session.config)
    state.close()
    if _is_worker(session.config):
        session.config.workeroutput[WORKEROUTPUT_KEY] = {
            "results": state.written,
            "golden_updates": state.golden_updates,
        }
        return
    outcomes.tracker(session.config).write_summary(
        state.options.results_dir / SUMMARY_FILE, state.written, state.options.results_dir,
        state.golden_updates,
    )


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist: merge a finished worker's results into the controller's summary."""
    output = node.workeroutput.get(WORKEROUTPUT_KEY)
    if output is None:
        return
    state = afd_session(node.config)
    state.written.extend(output["results"])
    state.golden_updates.extend(output["golden_updates"])


def _format_value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = afd_session(config)
    if _is_worker(config) or not (state.written or state.golden_updates):
        return
    reporter = terminalreporter
    reporter.section("pytest-afd results")
    rows = [
        (
            entry["case_id"],
            entry["case_kind"],
            state.outcomes.get(entry["nodeid"], "unknown"),
            f"{entry['metric']} {_format_value(entry['median'])} {entry['unit']}".strip(),
            _format_value(entry["cv"]),
            ",".join(
                label
                for label, on in (
                    ("synthetic", entry["synthetic"]),
                    ("exploratory", entry["comparability"] == "exploratory"),
                )
                if on
            )
            or "-",
        )
        for entry in sorted(state.written, key=lambda e: e["case_id"])
    ]
    header = ("case", "kind", "outcome", "headline (median)", "CV", "labels")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        reporter.write_line(
            "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
        )
    if state.written:
        reporter.write_line(
            f"{len(state.written)} result JSON file(s) in {state.options.results_dir} "
            f"(summary: {state.options.results_dir / SUMMARY_FILE})"
        )
    if state.golden_updates:
        reporter.write_line(
            f"{len(state.golden_updates)} golden(s) updated in {state.options.golden_dir}"
        )
