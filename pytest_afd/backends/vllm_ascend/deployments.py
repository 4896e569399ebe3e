"""A session's set of deployments: attach to several, or have the cluster's job system deploy them.

A *deployment* is one served configuration: the server-side RunSettings that
change a ``vllm serve`` command line (:data:`LAUNCH_FIELDS`), on one topology
and model. A stage compares policies, chunk sizes and cache settings, so it
needs several. Two ways to provide them, neither of which makes the harness a
cluster manager:

* ``AFD_ASCEND_DEPLOYMENTS=<file>``: a JSON list of ``{"url": ..., "settings":
  {...}}`` (optional ``"npu_topology"``, ``"model"``, ``"served_model_name"`` and
  ``"plan"``, the ``afd-launch-plan --json`` file it was started from),
  one entry per running deployment. Each run goes to the entry whose settings
  match its own; none matching raises :class:`DeploymentMissing` naming the
  settings (the plugin skips the case). ``AFD_ASCEND_SERVER_URL`` +
  ``AFD_ASCEND_SERVER_SETTINGS`` is the one-entry shorthand.
* ``AFD_ASCEND_DEPLOY_COMMAND``: a command the user owns (an ``sbatch`` or
  ``kubectl`` wrapper). Protocol (docs/ascend.md)::

      CMD up SETTINGS_JSON PLAN_JSON   # deploy; print the API URL as the last stdout line
      CMD down URL                     # stop what ``up`` printed URL for

  The harness waits for ``URL/health`` up to ``AFD_ASCEND_DEPLOY_TIMEOUT_S``,
  calls ``down`` once no remaining case needs the configuration, and at the
  end of the session for every deployment still up.

Every deployment is probed at start: one that does not answer raises
:class:`DeploymentUnreachable` (a session error, never a skip list).
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pytest_afd.core.backend import CapabilityMissing, RunSettings, run_settings_from
from pytest_afd.serving.http_backend import AttachedServer, server_side_settings

ENV_DEPLOYMENTS = "AFD_ASCEND_DEPLOYMENTS"
ENV_DEPLOY_COMMAND = "AFD_ASCEND_DEPLOY_COMMAND"
ENV_DEPLOY_TIMEOUT = "AFD_ASCEND_DEPLOY_TIMEOUT_S"
# Loading a DeepSeek V3.2 W8A8 checkpoint on two nodes and joining HCCL groups takes minutes.
DEFAULT_DEPLOY_TIMEOUT_S = 1800.0
DEPLOY_TIMES_FILE = "deploy-times.json"
"""Per settings key, the seconds each deploy took (pytest_afd.scheduling.study_cost reads it)."""
DOWN_TIMEOUT_S = 300.0
ACTION_UP = "up"
ACTION_DOWN = "down"
HEALTH_PATH = "/health"
HEALTH_POLL_S = 0.5
PROBE_TIMEOUT_S = 5.0
HTTP_OK = 200
ENTRY_KEYS = ("url", "settings", "npu_topology", "model", "served_model_name", "plan")
# RunSettings fields that change a ``vllm serve`` command line. split_align and
# pcp_size are the CPU emulation's view of the topology: on NPUs the topology
# itself fixes them, so they never pick another deployment.
LAUNCH_FIELDS = ("split_policy", "chunk_size", "prefix_caching", "routing", "quantization",
                 "max_num_batched_tokens", "max_num_seqs", "block_size")


class DeploymentConfigError(ValueError):
    """A bad deployments file, settings JSON or deploy command (names the variable and file)."""


class DeploymentMissing(CapabilityMissing):
    """No deployment serves this case's settings: the plugin skips the case with this reason."""


class DeploymentUnreachable(RuntimeError):
    """A deployment did not answer (or never came up): the session stops with this message."""


def launch_key(settings: RunSettings) -> dict[str, Any]:
    """The server-side fields of ``settings`` that pick a deployment (JSON-ready)."""
    return {name: getattr(settings, name) for name in LAUNCH_FIELDS}


def key_text(key: Mapping[str, Any]) -> str:
    return json.dumps(dict(key), sort_keys=True)


def settings_from(value: Any, where: str) -> RunSettings:
    """RunSettings from a JSON object (only the launch fields are kept)."""
    try:
        settings = run_settings_from(value, where)
    except ValueError as error:
        raise DeploymentConfigError(str(error)) from None
    try:
        return server_side_settings(settings, LAUNCH_FIELDS)
    except (TypeError, ValueError) as error:
        raise DeploymentConfigError(f"{where}: {error}") from None


@dataclass(frozen=True)
class Deployment:
    """One served configuration at ``url`` (``npu_topology``/``model`` None: the session's)."""

    url: str
    settings: RunSettings
    npu_topology: str | None = None
    model: str | None = None
    served_model_name: str | None = None
    # The ``afd-launch-plan --json`` file it was started from (manifest facts), if given.
    plan: str | None = None

    def serves(self, topology: str, model: str) -> bool:
        return self.npu_topology in (None, topology) and self.model in (None, model)


def is_http_url(url: Any) -> bool:
    """``url`` is ``http(s)://HOST[:PORT]...`` (a host named, not only a port)."""
    parts = urlsplit(url) if isinstance(url, str) else None
    return parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname)


def _check_url(url: Any, where: str) -> str:
    if not is_http_url(url):
        raise DeploymentConfigError(f"{where}: url {url!r} is not http(s)://HOST:PORT")
    return url.rstrip("/")


def parse_deployments(text: str, source: str) -> list[Deployment]:
    """Entries of a deployments file; ``source`` (``$VAR=path``) is named in every error."""
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as error:
        raise DeploymentConfigError(f"{source}: not JSON ({error})") from None
    if not isinstance(entries, list) or not entries:
        raise DeploymentConfigError(f"{source}: expected a non-empty JSON list of "
                                    '{"url": ..., "settings": {...}} entries')
    deployments = []
    for index, entry in enumerate(entries):
        where = f"{source} entry {index}"
        if not isinstance(entry, Mapping) or "url" not in entry or "settings" not in entry:
            raise DeploymentConfigError(f"{where}: expected an object with 'url' and 'settings'")
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown:
            raise DeploymentConfigError(f"{where}: unknown keys {unknown}; known: {list(ENTRY_KEYS)}")
        deployments.append(Deployment(
            url=_check_url(entry["url"], where), settings=settings_from(entry["settings"], where),
            npu_topology=entry.get("npu_topology"), model=entry.get("model"),
            served_model_name=entry.get("served_model_name"), plan=entry.get("plan")))
    return deployments


def load_deployments(path_text: str) -> list[Deployment]:
    source = f"${ENV_DEPLOYMENTS}={path_text}"
    try:
        text = Path(path_text).read_text()
    except OSError as error:
        raise DeploymentConfigError(f"{source}: cannot read the file ({error.strerror})") from None
    return parse_deployments(text, source)


def probe(url: str, path: str = HEALTH_PATH, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when ``url + path`` answers 200, else what went wrong (the connection error)."""
    parts = urlsplit(url)
    connection_class = (http.client.HTTPSConnection if parts.scheme == "https"
                        else http.client.HTTPConnection)
    connection = connection_class(parts.hostname, parts.port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        status = connection.getresponse().status
    except OSError as error:
        return f"{type(error).__name__}: {error}"
    finally:
        connection.close()
    return None if status == HTTP_OK else f"GET {path} answered HTTP {status}"


def require_reachable(url: str, source: str) -> None:
    problem = probe(url)
    if problem is not None:
        raise DeploymentUnreachable(f"deployment {url} ({source}) is unreachable: {problem}")


def missing_message(settings: RunSettings, deployments: Sequence[Deployment], source: str,
                    topology: str, model: str) -> str:
    """Which settings no deployment serves, and how the nearest one differs."""
    wanted = launch_key(settings)
    text = (f"no deployment in {source} serves {topology} model {model!r} with settings "
            f"{key_text(wanted)}")
    candidates = [item for item in deployments if item.serves(topology, model)]
    if not candidates:
        return text + f"; none is declared for {topology} model {model!r}"
    nearest = min(candidates, key=lambda item: sum(
        value != wanted[name] for name, value in launch_key(item.settings).items()))
    differences = {name: (value, wanted[name]) for name, value in launch_key(nearest.settings).items()
                   if value != wanted[name]}
    return (text + f"; the nearest, {nearest.url}, differs in (deployment, case) {differences}: "
            "deploy one with these settings (pytest --afd-list-deployments lists them)")


class AttachedSet:
    """Launcher over deployments someone else started: pick the one whose settings match."""

    def __init__(self, deployments: Sequence[Deployment], *, source: str, topology: str,
                 model: str, served_names: Mapping[str, str]) -> None:
        self.deployments = list(deployments)
        self.source = source
        self.topology = topology
        self.model = model
        self.served_names = dict(served_names)

    def __call__(self, settings: RunSettings) -> AttachedServer:
        wanted = server_side_settings(settings, LAUNCH_FIELDS)
        for item in self.deployments:
            if item.serves(self.topology, self.model) and item.settings == wanted:
                return AttachedServer(base_url=item.url, model=self.served_names[item.url])
        raise DeploymentMissing(missing_message(wanted, self.deployments, self.source,
                                                self.topology, self.model))

    def release(self, keys: Any) -> None:
        """Nothing to stop: these deployments belong to whoever started them."""

    def close(self) -> None:
        """Nothing to stop."""


@dataclass
class DeployedServer:
    """A deployment the deploy command started; the pool, not the backend, stops it."""

    base_url: str
    model: str

    def exit_reason(self) -> str | None:
        return None

    def close(self) -> None:
        """The pool stops it (``down``) once no remaining case needs it."""


def deploy_timeout(environ: Mapping[str, str]) -> float:
    text = environ.get(ENV_DEPLOY_TIMEOUT, "").strip()
    if not text:
        return DEFAULT_DEPLOY_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise DeploymentConfigError(f"${ENV_DEPLOY_TIMEOUT}={text!r}: expected seconds > 0")
    return value


def deploy_command(environ: Mapping[str, str]) -> list[str]:
    text = environ.get(ENV_DEPLOY_COMMAND, "")
    try:
        argv = shlex.split(text)
    except ValueError as error:
        raise DeploymentConfigError(f"${ENV_DEPLOY_COMMAND}={text!r}: {error}") from None
    if not argv:
        raise DeploymentConfigError(f"${ENV_DEPLOY_COMMAND} is empty")
    return argv


class DeployPool:
    """Launcher that has the user's deploy command start each configuration once, on first use.

    ``plan_for(settings)`` gives the plan document handed to ``up``;
    ``served_name(url)`` reads the served model name of a new deployment.
    """

    def __init__(self, command: Sequence[str], *, plan_for: Any, served_name: Any,
                 timeout_s: float, work_dir: Path) -> None:
        self.command = list(command)
        self.plan_for = plan_for
        self.served_name = served_name
        self.timeout_s = timeout_s
        self.work_dir = Path(work_dir)
        self.up: dict[str, DeployedServer] = {}
        self.deploy_count: dict[str, int] = {}

    def __call__(self, settings: RunSettings) -> DeployedServer:
        wanted = server_side_settings(settings, LAUNCH_FIELDS)
        key = key_text(launch_key(wanted))
        if key not in self.up:
            self.up[key] = self._deploy(wanted, key)
            self.deploy_count[key] = self.deploy_count.get(key, 0) + 1
        return self.up[key]

    def _run(self, argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        shown = shlex.join(argv)
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
        except FileNotFoundError:
            raise DeploymentConfigError(f"${ENV_DEPLOY_COMMAND}: {argv[0]!r} not found") from None
        except subprocess.TimeoutExpired:
            raise DeploymentUnreachable(f"`{shown}` ran past {timeout_s:g} s "
                                        f"(${ENV_DEPLOY_TIMEOUT})") from None

    def _deploy(self, settings: RunSettings, key: str) -> DeployedServer:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        index = sum(self.deploy_count.values())
        settings_file = self.work_dir / f"deployment-{index}-settings.json"
        plan_file = self.work_dir / f"deployment-{index}-plan.json"
        settings_file.write_text(key + "\n")
        plan_file.write_text(json.dumps(self.plan_for(settings), indent=2) + "\n")
        argv = [*self.command, ACTION_UP, str(settings_file), str(plan_file)]
        started = time.monotonic()
        completed = self._run(argv, self.timeout_s)
        lines = [line.strip() for line in completed.stdout.splitlines() if line.strip()]
        if completed.returncode != 0 or not lines:
            raise DeploymentUnreachable(
                f"`{shlex.join(argv)}` exited {completed.returncode} without printing a URL: "
                f"{(completed.stderr or completed.stdout).strip()[-600:]!r}")
        url = _check_url(lines[-1], f"${ENV_DEPLOY_COMMAND} {ACTION_UP} output")
        deadline = started + self.timeout_s
        problem = probe(url)
        while problem is not None and time.monotonic() < deadline:
            time.sleep(HEALTH_POLL_S)
            problem = probe(url)
        if problem is not None:
            self._down(url)
            raise DeploymentUnreachable(
                f"deployment {url} from ${ENV_DEPLOY_COMMAND} (settings {key}) never answered "
                f"{HEALTH_PATH} within {self.timeout_s:g} s: {problem}")
        self._record_deploy_time(key, time.monotonic() - started)
        return DeployedServer(base_url=url, model=self.served_name(url))

    def _record_deploy_time(self, key: str, seconds: float) -> None:
        """Append this deploy's seconds (command to healthy) to ``deploy-times.json`` next
        to the plans: the listing's device-time estimate reads them (pytest_afd.scheduling.study_cost)."""
        path = self.work_dir / DEPLOY_TIMES_FILE
        try:
            recorded = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            recorded = {}  # a damaged record is replaced, never trusted
        recorded.setdefault(key, []).append(round(seconds, 3))
        path.write_text(json.dumps(recorded, indent=1) + "\n")

    def _down(self, url: str) -> str | None:
        completed = self._run([*self.command, ACTION_DOWN, url], DOWN_TIMEOUT_S)
        if completed.returncode != 0:
            return f"`{ACTION_DOWN} {url}` exited {completed.returncode}: {completed.stderr.strip()[-300:]}"
        return None

    def release(self, keys: Any) -> None:
        """Stop the deployments whose settings key is in ``keys`` (no later case needs them)."""
        for key in [key for key in self.up if key in keys]:
            self._down(self.up.pop(key).base_url)

    def close(self) -> None:
        problems = [problem for problem in (self._down(server.base_url)
                                            for server in self.up.values()) if problem]
        self.up.clear()
        if problems:
            raise DeploymentUnreachable("; ".join(problems))


def plan_work_dir(results_dir: str | os.PathLike[str] | None) -> Path:
    if results_dir is None:
        return Path(tempfile.mkdtemp(prefix="afd-deployments-"))
    return Path(results_dir) / "deployments"
