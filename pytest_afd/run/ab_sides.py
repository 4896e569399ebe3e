"""Interleaved A/B of two deployments or two code versions: ``--afd-ab-url``, ``--afd-ab-python``,
``--afd-ab-checkout``.

``--afd-ab A B`` (pytest_afd.run.ab) compares two option sets on one backend.
Two sessions of two code versions on a busy host differ by far more than the
code does (issue 40: a 1.5x slowdown hidden, A/A pairs called), so these flags
give the same interleaving to what a user really wants to compare:

* ``--afd-ab-url URL_A URL_B``: two running deployments, attached the way
  ``AFD_ASCEND_SERVER_URL`` attaches one (both started with the settings in
  ``AFD_ASCEND_SERVER_SETTINGS``).
* ``--afd-ab-python PY_A PY_B`` and/or ``--afd-ab-checkout DIR_A DIR_B``: two
  code versions of the CPU backend. Each side is the harness's own CPU server
  (``pytest-afd deploy-cpu``, one per settings a case needs) started with that
  side's interpreter and ``PYTHONPATH=DIR``, then driven through the same
  attach path as two URLs. The deploy pool stops every server it started when
  the session ends (also on Ctrl-C or a failure: session fixture teardown).

One path for both: each side is a vllm-ascend HTTP backend over its own
environment (:func:`side_environ`); side A is the session backend (the
``pytest_afd_create_backend`` hook below), side B a stage pool backend, so the
hardware ledger asks both whether they are a stand-in (the harness's server
always says so). Every ``<case>/ab-A`` / ``/ab-B`` result carries
``evidence.ab_side``: what the user gave (URL, interpreter, checkout and its git
commit) and what the serving deployment reported (its URL, model listing,
stand-in device, and the code the CPU server really imported).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from afd_split.hook.planning.worker_evidence import EVIDENCE_DIR_ENV as EVIDENCE_VARIABLE
from pytest_afd.core.absent import absent
from pytest_afd.core.code_identity import checkout_commit
from pytest_afd.run.ab import FLAG as SETTINGS_FLAG
from pytest_afd.run.ab import SIDES

URL_FLAG = "--afd-ab-url"
PYTHON_FLAG = "--afd-ab-python"
CHECKOUT_FLAG = "--afd-ab-checkout"
KIND_DEPLOYMENTS = "deployments"
KIND_CODE = "code"
URL_BACKEND = "vllm-ascend"
CODE_BACKEND = "cpu"
PROBE_TIMEOUT_S = 120
# Run by each side's interpreter with its PYTHONPATH: self-contained, so an older checkout
# (without pytest_afd.core.code_identity) can be compared too; deploy-cpu must import.
# An editable install elsewhere can fill in modules a partial checkout lacks: both are checked.
PROBE = ("import json, pathlib, platform, sys, pytest_afd, pytest_afd.serving.cpu_deploy as d; "
         "print(json.dumps({'python': sys.executable, 'python_version': platform.python_version(),"
         " 'pytest_afd': str(pathlib.Path(pytest_afd.__file__).resolve().parent),"
         " 'deploy_module': str(pathlib.Path(d.__file__).resolve())}))")
SAFE_PATH = "PYTHONSAFEPATH"
SIDES_KEY = pytest.StashKey["AbSides | None"]()
PLUGIN_NAME = "afd-ab-sides"


def _variables() -> Any:
    """The vllm-ascend backend's variable names (imported only when these flags are given:
    the plugin loads this module in every session)."""
    from types import SimpleNamespace

    from pytest_afd.backends.vllm_ascend.attach import ENV_DEVICES_PER_NODE
    from pytest_afd.backends.vllm_ascend.deployments import ENV_DEPLOY_COMMAND, ENV_DEPLOYMENTS
    from pytest_afd.backends.vllm_ascend.plan import ENV_ATTACH_SETTINGS, ENV_ATTACH_URL

    # The ones that pick a deployment: with two URLs or two code versions, which would it be?
    return SimpleNamespace(url=ENV_ATTACH_URL, settings=ENV_ATTACH_SETTINGS,
                           command=ENV_DEPLOY_COMMAND, devices=ENV_DEVICES_PER_NODE,
                           picking=(ENV_ATTACH_URL, ENV_DEPLOYMENTS, ENV_DEPLOY_COMMAND))


def add_options(group: Any) -> None:
    group.addoption(URL_FLAG, nargs=2, default=None, metavar=("URL_A", "URL_B"),
                    dest="afd_ab_url",
                    help="interleaved A/B of two deployments (--afd-backend vllm-ascend, both "
                         "started with $AFD_ASCEND_SERVER_SETTINGS): every stage case on A and on B, "
                         "alternating per repetition; results <case>/ab-A and <case>/ab-B")
    group.addoption(PYTHON_FLAG, nargs=2, default=None, metavar=("PY_A", "PY_B"),
                    dest="afd_ab_python",
                    help="interleaved A/B of two interpreters on the CPU backend: each side is "
                         "the harness's CPU server run by that interpreter")
    group.addoption(CHECKOUT_FLAG, nargs=2, default=None, metavar=("DIR_A", "DIR_B"),
                    dest="afd_ab_checkout",
                    help="interleaved A/B of two pytest-afd checkouts on the CPU backend: each "
                         "side is the CPU server run with PYTHONPATH=DIR (its git commit recorded)")


@dataclass(frozen=True)
class Side:
    """One side: a deployment URL, or a code version (interpreter and/or checkout)."""

    name: str  # "ab-A" / "ab-B": the result's case suffix
    letter: str
    url: str | None = None
    python: str | None = None
    checkout: str | None = None
    # What the side's interpreter reported (PROBE), plus the checkout's git commit.
    code: Mapping[str, Any] = field(default_factory=dict)

    def declared(self) -> dict[str, Any]:
        """What the user gave for this side, and what the harness found out about it."""
        if self.url is not None:
            return {"side": self.letter, "kind": KIND_DEPLOYMENTS, "url": self.url}
        return {"side": self.letter, "kind": KIND_CODE, "python": self.python,
                "checkout": self.checkout, "code": dict(self.code)}


@dataclass(frozen=True)
class AbSides:
    kind: str
    sides: tuple[Side, Side]

    def side(self, name: str) -> Side:
        return {side.name: side for side in self.sides}[name]


# --- reading and checking the flags --------------------------------------------------------
def _check_url(text: str, letter: str, reach: bool) -> str:
    from pytest_afd.backends.vllm_ascend.deployments import is_http_url, probe

    url = text.strip().rstrip("/")
    if not is_http_url(url):
        raise ValueError(f"{URL_FLAG} {letter} {text!r}: not an http(s)://HOST:PORT URL")
    if reach:
        problem = probe(url)
        if problem is not None:
            raise ValueError(f"{URL_FLAG} {letter} {text!r}: deployment unreachable: {problem}")
    return url


def _interpreter(text: str, letter: str) -> str:
    found = shutil.which(text)
    if found is None:
        raise ValueError(f"{PYTHON_FLAG} {letter} {text!r}: no such interpreter (not on PATH "
                         "and not an executable file)")
    return str(Path(found).absolute())


def _checkout(text: str, letter: str) -> str:
    directory = Path(text).expanduser().resolve()
    if not (directory / "pytest_afd" / "__init__.py").is_file():
        raise ValueError(f"{CHECKOUT_FLAG} {letter} {text!r}: not a pytest-afd checkout (no "
                         f"pytest_afd/__init__.py in {directory})")
    return str(directory)


def code_variables(checkout: str | None) -> dict[str, str]:
    """What a side's processes run with. ``PYTHONPATH`` is the checkout alone (another one on it
    would shadow the code being compared; without a checkout: the interpreter's own). And
    ``PYTHONSAFEPATH`` (Python >= 3.11, inherited by the server the deploy command starts): else
    ``python -m`` puts the working directory first on ``sys.path``, and a session started in
    a checkout would run that checkout's code on both sides (the probe checks it)."""
    return {SAFE_PATH: "1", **({} if checkout is None else {"PYTHONPATH": checkout})}


def probe_code(python: str, checkout: str | None, letter: str, source: str) -> dict[str, Any]:
    """The interpreter, version and pytest_afd the side really runs (and the checkout's commit)."""
    try:
        done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True,
                              env={**os.environ, **code_variables(checkout)}, timeout=PROBE_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ValueError(f"{source} {letter}: {python} could not run ({error})") from None
    if done.returncode != 0:
        raise ValueError(f"{source} {letter}: {python} cannot import the harness's CPU server "
                         f"(pytest_afd.serving.cpu_deploy) with PYTHONPATH={checkout}: "
                         f"{done.stderr.strip()[-400:]}")
    code = json.loads(done.stdout.strip().splitlines()[-1])
    if checkout is not None:
        outside = [path for path in (code["pytest_afd"], code["deploy_module"])
                   if not Path(path).is_relative_to(checkout)]
        if outside:
            raise ValueError(f"{CHECKOUT_FLAG} {letter} {checkout!r}: {python} imports "
                             f"{outside[0]}, not the checkout's code (an incomplete checkout, "
                             "or another pytest_afd first on sys.path)")
        code.update(checkout_commit(checkout))
    return code


def parse_sides(urls: Sequence[str] | None, pythons: Sequence[str] | None,
                checkouts: Sequence[str] | None, *, settings_ab: Sequence[str] | None,
                backend: str, environ: Mapping[str, str], reach: bool = True) -> AbSides | None:
    """The two sides, or None without these flags; ValueError naming the bad value and flag."""
    if not (urls or pythons or checkouts):
        return None
    given = [flag for flag, values in ((URL_FLAG, urls), (PYTHON_FLAG, pythons),
                                       (CHECKOUT_FLAG, checkouts)) if values]
    if settings_ab:
        raise ValueError(f"{SETTINGS_FLAG} {list(settings_ab)} and {', '.join(given)}: the sides "
                         "would differ in option set and in deployment or code at once, and the "
                         "call could not say which made the difference; give one of them")
    if urls and (pythons or checkouts):
        raise ValueError(f"{URL_FLAG} compares two deployments and {PYTHON_FLAG} / "
                         f"{CHECKOUT_FLAG} two code versions on the CPU backend: give one")
    names = _variables()
    setting = [name for name in names.picking if environ.get(name)]
    if setting:
        raise ValueError(f"${setting[0]}={environ[setting[0]]!r} and {given[0]}: which "
                         "deployment is A and which is B? Unset the variable")
    if urls:
        if backend != URL_BACKEND:
            raise ValueError(f"{URL_FLAG} attaches to two deployments through the "
                             f"{URL_BACKEND} backend: add --afd-backend {URL_BACKEND} "
                             f"(got {backend!r})")
        if not environ.get(names.settings):
            raise ValueError(f"{URL_FLAG} needs ${names.settings}: the RunSettings JSON "
                             "both deployments were started with")
        sides = tuple(Side(name, name[-1], url=_check_url(url, name[-1], reach))
                      for name, url in zip(SIDES, urls, strict=True))
        return AbSides(KIND_DEPLOYMENTS, sides)  # type: ignore[arg-type]
    if backend != CODE_BACKEND:
        raise ValueError(f"{given[0]} compares two code versions of the {CODE_BACKEND} backend "
                         f"(each side its own CPU server): got --afd-backend {backend!r}")
    pythons = [_interpreter(text, name[-1]) for name, text in zip(SIDES, pythons, strict=True)
               ] if pythons else [sys.executable] * 2  # checkouts alone: the harness's interpreter
    dirs = ([_checkout(text, name[-1]) for name, text in zip(SIDES, checkouts, strict=True)]
            if checkouts else [None, None])
    source = given[-1] if checkouts else given[0]
    sides = tuple(Side(name, name[-1], python=python, checkout=directory,
                       code=probe_code(python, directory, name[-1], source))
                  for name, python, directory in zip(SIDES, pythons, dirs, strict=True))
    return AbSides(KIND_CODE, sides)  # type: ignore[arg-type]


# --- each side's backend -----------------------------------------------------------------------
def side_environ(side: Side, base: Mapping[str, str], devices: int,
                 evidence_dir: Path | None = None) -> dict[str, str]:
    """The environment the side's vllm-ascend backend reads: its URL to attach to, or a deploy
    command running the side's interpreter with ``PYTHONPATH`` = its checkout. ``evidence_dir``
    (code sides): where that side's servers write their step lines, read back per run, so the
    stage checks see each side's own steps (the deployments of a URL side write where they
    were told)."""
    names = _variables()
    env = {key: value for key, value in base.items() if key not in names.picking}
    if side.url is not None:
        env[names.url] = side.url
        return env
    variables = [f"{name}={value}" for name, value in code_variables(side.checkout).items()]
    if evidence_dir is not None:
        env[EVIDENCE_VARIABLE] = str(evidence_dir)
        variables.append(f"{EVIDENCE_VARIABLE}={evidence_dir}")
    command = ["env", *variables, side.python, "-m", "pytest_afd.cli", "deploy-cpu"]
    env[names.command] = shlex.join(command)
    env[names.devices] = str(devices)  # one CPU "node" holds the whole layout
    return env


def create_side_backend(side: Side, *, topology: Any, model_name: str, seed: int,
                        results_dir: str | os.PathLike[str], devices_per_node: int | None = None,
                        environ: Mapping[str, str] | None = None) -> Any:
    """The side's backend (vllm-ascend over HTTP); plans and logs under ``results_dir/<side>``."""
    from pytest_afd.backends.vllm_ascend.backend import create_backend

    base = os.environ if environ is None else environ
    directory = Path(results_dir).absolute() / side.name
    evidence = None
    if side.url is None:
        evidence = directory / "evidence"
        evidence.mkdir(parents=True, exist_ok=True)
    return create_backend(topology=topology, model_name=model_name, seed=seed,
                          results_dir=directory,
                          environ=side_environ(side, base, topology.total_ranks, evidence),
                          devices_per_node=devices_per_node if side.url is not None else None)


def served_facts(description: Mapping[str, Any]) -> dict[str, Any]:
    """What the deployment that served the side's runs reports about itself (from the backend's
    ``describe()`` after its runs): URL, model listing, stand-in device, the code it imported."""
    url = description.get("base_url")
    facts: dict[str, Any] = {"url": url or absent("no deployment has served this side yet")}
    listed = [item for item in description.get("deployments", []) if item.get("url") == url]
    if listed:  # attached: the deployment's model listing and the settings it was declared with
        facts["models"] = listed[0].get("models", listed[0].get("models_error"))
        facts["settings"] = listed[0].get("settings")
    server = description.get("server")
    if isinstance(server, Mapping):
        backend = server.get("backend") if isinstance(server.get("backend"), Mapping) else {}
        facts["stand_in_device"] = backend.get("device")
        facts["settings"] = server.get("settings", facts.get("settings"))  # what it runs with
        facts["code"] = server.get("code") or absent(
            "the server's /afd/describe reports no code identity (an older pytest-afd)")
    else:
        facts["stand_in_device"] = None
        facts["code"] = absent(description.get("server_describe_error") or
                               "the deployment has no /afd/describe: not the harness's server")
    return facts


def side_evidence(side: Side, backend: Any) -> dict[str, Any]:
    """``evidence.ab_side`` of a result: the side as declared and as served."""
    return {**side.declared(), "served": served_facts(backend.describe())}


# --- the session -------------------------------------------------------------------------------
class SidesPlugin:
    """Side A is the session backend; side B is made by the stage pool (suites/stage_backends)."""

    def __init__(self, sides: AbSides) -> None:
        self.sides = sides

    def pytest_afd_create_backend(self, config: pytest.Config, name: str, topology: Any,
                                  model_name: str, seed: int, results_dir: Any) -> Any:
        from pytest_afd.run.session import afd_session

        kwargs = afd_session(config).hardware_kwargs()
        return create_side_backend(self.sides.sides[0], topology=topology, model_name=model_name,
                                   seed=seed, results_dir=results_dir, **kwargs)


def configure(config: pytest.Config, backend: str) -> None:
    """Read and check the flags once (a UsageError names the bad value); register side A."""
    try:
        sides = parse_sides(config.getoption("afd_ab_url", None),
                            config.getoption("afd_ab_python", None),
                            config.getoption("afd_ab_checkout", None),
                            settings_ab=config.getoption("afd_ab", None), backend=backend,
                            environ=os.environ)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[SIDES_KEY] = sides
    if sides is not None:
        config.pluginmanager.register(SidesPlugin(sides), PLUGIN_NAME)


def from_config(config: pytest.Config) -> AbSides | None:
    return config.stash.get(SIDES_KEY, None)
