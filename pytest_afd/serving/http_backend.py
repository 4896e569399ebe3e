"""A :class:`~pytest_afd.core.backend.Backend` that drives OpenAI-style servers over HTTP.

Server-side settings (split policy, chunking, prefix caching, ...) are fixed
when a server starts, so the backend starts servers through a *launcher* and
restarts them when a run asks for different server-side settings. The
vLLM-Ascend backend launches ``vllm serve`` processes from a launch plan (or
attaches to a deployment started by the cluster's job system); tests launch the
CPU backend's HTTP server.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pytest_afd.core.backend import (
    CAP_TOPK_LOGPROBS,
    PromptRequest,
    RequestOutput,
    RunOutputs,
    RunSettings,
)
from pytest_afd.serving.client import Arrival, ClientError, CompletionsClient
from pytest_afd.serving.lifecycle import ManagedServer, ServerSpec
from pytest_afd.serving.logprobs import DEFAULT_NUM_LOGPROBS
from pytest_afd.serving.requests import STAND_IN_FIELD

# RequestOutput.next_token of a request that produced no token.
NO_TOKEN = -1
DEFAULT_CPU_STARTUP_TIMEOUT_S = 120.0
# Build and CI machines have two cores shared by test workers: one intra-op
# thread per server keeps a served model from oversubscribing them.
DEFAULT_CPU_SERVER_THREADS = 1


class ServerSession(Protocol):
    """A running deployment the client can talk to."""

    base_url: str
    model: str

    def exit_reason(self) -> str | None: ...

    def close(self) -> None: ...


Launcher = Callable[[RunSettings], ServerSession]


@dataclass
class AttachedServer:
    """A deployment someone else started (e.g. the cluster job system): never stopped here."""

    base_url: str
    model: str

    def exit_reason(self) -> str | None:
        return None

    def close(self) -> None:
        """Nothing to stop: the deployment belongs to whoever started it."""


@dataclass
class ManagedSession:
    """One managed server process (or group) whose API lives at ``base_url``."""

    server: Any  # ManagedServer or ServerGroup
    base_url: str
    model: str

    def exit_reason(self) -> str | None:
        return self.server.exit_reason()

    def close(self) -> None:
        self.server.stop()


# Fields only the client side uses: changing them never needs another server.
CLIENT_SIDE_FIELDS = ("instrument", "return_logits")


def server_side_settings(settings: RunSettings,
                         server_fields: tuple[str, ...] | None = None) -> RunSettings:
    """The part of the settings a server is started with; other fields take their defaults.

    ``server_fields`` None means every field except :data:`CLIENT_SIDE_FIELDS`.
    ``return_logits`` is always off: no logits cross the HTTP API.
    """
    defaults = RunSettings()
    names = [item.name for item in dataclasses.fields(RunSettings)]
    keep = set(server_fields) if server_fields is not None else set(names) - set(CLIENT_SIDE_FIELDS)
    reset = {name: getattr(defaults, name) for name in names if name not in keep}
    return dataclasses.replace(settings, **{**reset, "return_logits": False})


def cpu_server_spec(settings: RunSettings, *, name: str, log_dir: Path, topology: str | None,
                    model_name: str, seed: int,
                    startup_timeout_s: float = DEFAULT_CPU_STARTUP_TIMEOUT_S,
                    threads: int = DEFAULT_CPU_SERVER_THREADS,
                    peer_timeout_s: float | None = None) -> ServerSpec:
    """Spec of the CPU backend served by ``python -m pytest_afd.serving.server`` on loopback
    (``peer_timeout_s``: the AFD runtime's, for ``afd_processes``; None: its default)."""
    port_file = Path(log_dir) / f"{name}.port"
    argv = [sys.executable, "-m", "pytest_afd.cli", "serve", "--backend", "cpu",
            "--model-name", model_name, "--seed", str(seed), "--results-dir", str(log_dir),
            "--port", "0", "--port-file", str(port_file),
            "--settings-json", json.dumps(dataclasses.asdict(server_side_settings(settings)))]
    if topology is not None:
        argv += ["--topology", topology]
    if peer_timeout_s is not None:
        argv += ["--afd-peer-timeout-s", str(peer_timeout_s)]
    env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return ServerSpec(name=name, argv=tuple(argv), env=env, port_file=port_file,
                      startup_timeout_s=startup_timeout_s)


def cpu_server_launcher(*, log_dir: Path, topology: str | None, model_name: str, seed: int,
                        startup_timeout_s: float = DEFAULT_CPU_STARTUP_TIMEOUT_S) -> Launcher:
    def launch(settings: RunSettings) -> ServerSession:
        spec = cpu_server_spec(settings, name="cpu-server", log_dir=log_dir, topology=topology,
                               model_name=model_name, seed=seed, startup_timeout_s=startup_timeout_s)
        server = ManagedServer(spec, log_dir).start()
        return ManagedSession(server=server, base_url=server.base_url, model=model_name)

    return launch


STEPS_NOT_OVER_HTTP = ("per-step split evidence does not cross the HTTP API: set "
                       "AFD_EVIDENCE_DIR on the deployment's servers and on the harness "
                       "(one shared directory) to collect the servers' step lines")


class HttpBackend:
    """Backend protocol over HTTP; no logits, steps or expert load cross the wire.

    With ``return_logits`` a backend that declares :data:`CAP_TOPK_LOGPROBS`
    asks for the generated token's top-k logprobs instead (what the gates compare).
    """

    def __init__(self, name: str, capabilities: frozenset[str], launcher: Launcher, *,
                 describe_extra: dict[str, Any] | None = None,
                 request_timeout_s: float | None = None,
                 server_fields: tuple[str, ...] | None = None,
                 api_key: str | None = None) -> None:
        self.name = name
        self.capabilities = capabilities
        self._launcher = launcher
        self._describe_extra = dict(describe_extra or {})
        self._request_timeout_s = request_timeout_s
        self._server_fields = server_fields
        self._api_key = api_key
        self._session: ServerSession | None = None
        self._session_settings: RunSettings | None = None
        self.launches = 0
        # Server-side settings each run asked for, in order (the plugin checks them against
        # what the case declared it needs: docs/plugin.md "Deployments").
        self.requested: list[RunSettings] = []
        # Runs in which every request came back without error (the no-false-green count).
        self.completed_runs = 0
        # Of those, the runs a pytest-afd server standing in for the deployment served (its
        # label read from the session that served the run, while it was up), and its device.
        self.stand_in_runs = 0
        self.last_stand_in_device: str | None = None
        self._labels: dict[str, str | None] = {}  # base URL -> stand-in device (None: none)

    def _client(self, session: ServerSession) -> CompletionsClient:
        if self._request_timeout_s is None:
            return CompletionsClient(session.base_url, session.model, api_key=self._api_key)
        return CompletionsClient(session.base_url, session.model,
                                 request_timeout_s=self._request_timeout_s, api_key=self._api_key)

    def session_for(self, settings: RunSettings) -> ServerSession:
        """The running session for these settings, (re)starting servers when they differ."""
        wanted = server_side_settings(settings, self._server_fields)
        self.requested.append(wanted)
        if self._session is not None and self._session_settings == wanted:
            reason = self._session.exit_reason()
            if reason is None:
                return self._session
        if self._session is not None:
            self._session.close()
            self._session = None
        self._session = self._launcher(wanted)
        self._session_settings = wanted
        self.launches += 1
        return self._session

    def run(self, prompts: Sequence[PromptRequest], settings: RunSettings) -> RunOutputs:
        session = self.session_for(settings)
        logprobs = self.num_logprobs(settings)
        started = time.perf_counter()
        client_run = self._client(session).run(prompts, Arrival(), read_metrics=False,
                                               server_gone=session.exit_reason, logprobs=logprobs,
                                               instrument=settings.instrument)
        outputs = []
        for result in client_run.results:
            error = result.error
            if error is None and not result.token_ids:
                error = ("the server returned no token ids; it must honour the completions "
                         "request field return_token_ids")
            outputs.append(RequestOutput(
                request_id=result.request_id,
                num_prompt_tokens=result.num_input_tokens,
                # vLLM omits cached_tokens when it is 0 (--enable-prompt-tokens-details on).
                num_cached_tokens=result.num_cached_tokens or 0,
                next_token=result.token_ids[0] if result.token_ids else NO_TOKEN,
                top_logprobs=result.top_logprobs,
                ttft_s=result.ttft_s,
                error=error,
            ))
        if outputs and all(output.error is None for output in outputs):
            self.completed_runs += 1
            device = self._stand_in_label(session)
            if device is not None:
                self.stand_in_runs += 1
                self.last_stand_in_device = device
        return RunOutputs(requests=outputs, wall_time_s=time.perf_counter() - started,
                          steps_absent_reason=STEPS_NOT_OVER_HTTP)

    def num_logprobs(self, settings: RunSettings) -> int | None:
        """Top-k logprobs to ask for: when outputs are wanted and the backend declares them."""
        if settings.return_logits and CAP_TOPK_LOGPROBS in self.capabilities:
            return DEFAULT_NUM_LOGPROBS
        return None

    def reset_prefix_cache(self) -> None:
        if self._session is not None:
            self._client(self._session).reset_prefix_cache()

    def describe(self) -> dict[str, Any]:
        description: dict[str, Any] = {"backend": self.name, "transport": "http",
                                       **self._describe_extra}
        if self._session is not None:
            description["base_url"] = self._session.base_url
            try:
                description["server"] = self.server_description()
            except (ClientError, ValueError) as error:
                description["server_describe_error"] = str(error)
        return description

    def server_description(self) -> dict[str, Any]:
        """The CPU HTTP server's ``GET /afd/describe`` (vLLM has no such route: ClientError)."""
        if self._session is None:
            raise ClientError("no server session yet")
        return self._client(self._session).get_json("/afd/describe")

    def _stand_in_label(self, session: ServerSession) -> str | None:
        """The stand-in device the server of ``session`` labels itself with, else None (asked
        once per server: its ``/v1/models`` entries' ``STAND_IN_FIELD``, else its
        ``/afd/describe``; a vLLM deployment has neither)."""
        url = session.base_url
        if url not in self._labels:
            client = self._client(session)
            device = None
            try:
                for entry in client.get_json("/v1/models")["data"]:
                    label = entry.get(STAND_IN_FIELD) if isinstance(entry, dict) else None
                    if isinstance(label, dict) and label.get("device") is not None:
                        device = str(label["device"])
            except (ClientError, ValueError, KeyError, TypeError):
                device = None
            if device is None:
                try:
                    device = client.get_json("/afd/describe")["backend"]["device"]
                except (ClientError, ValueError, KeyError, TypeError):
                    device = None
            self._labels[url] = device
        return self._labels[url]

    def stand_in_device(self) -> str | None:
        """The device of a pytest-afd server standing in for a deployment, else None.

        The harness's own server labels itself (``/v1/models``, ``/afd/describe``); a vLLM
        deployment does not, so it counts as the hardware it was launched on. The label
        read when a run completed is kept: a case that dropped its session (a later
        run asked for a deployment that is missing) is still known to have run on it.
        """
        if self.last_stand_in_device is not None:
            return self.last_stand_in_device
        if self._session is None:
            return None
        return self._stand_in_label(self._session)

    def drop_session(self) -> None:
        """Stop the current servers; the next run starts its deployment afresh (launch mode's
        profiled deployment: its profiler window is spent after one instrumented run)."""
        if self._session is not None:
            self._session.close()
            self._session = None
            self._session_settings = None

    def release_deployments(self, keys: Any) -> None:
        """Let a launcher that keeps several deployments stop those no later case needs."""
        release = getattr(self._launcher, "release", None)
        if release is not None:
            release(keys)

    def stand_in_description(self) -> dict[str, Any] | None:
        """The harness's own server's backend description (``/afd/describe``), else None."""
        try:
            described = self.server_description()["backend"]
        except (ClientError, ValueError, KeyError, TypeError):
            return None
        return described if isinstance(described, dict) else None

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
        close_launcher = getattr(self._launcher, "close", None)
        if close_launcher is not None:  # deployments a deploy command started: stopped here
            close_launcher()
