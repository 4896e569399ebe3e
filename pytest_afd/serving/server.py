"""Serve any :class:`~pytest_afd.backends.base.Backend` over an OpenAI-style HTTP API.

The same client, lifecycle and metrics code then runs against the CPU backend
here and against vLLM-Ascend on a cluster. Endpoints (loopback only; there is no
authentication): ``POST /v1/completions`` (prompt token ids, ``max_tokens=1``,
optional SSE streaming), ``GET /health``, ``GET /metrics`` (vLLM counter names),
``GET /v1/models``, ``POST /reset_prefix_cache`` and ``GET /afd/describe``.

Concurrent requests are queued and prefilled together by one engine thread
(:mod:`pytest_afd.serving.engine`), the way a serving scheduler batches waiting
prefills. Requests are validated while they are read
(:mod:`pytest_afd.serving.requests`, :mod:`pytest_afd.serving.handler`);
connections are capped and every request has a deadline
(:mod:`pytest_afd.serving.connections`). On SIGTERM the server stops
accepting, lets the running batch finish and answers 503 to every request still
queued. Limits, deadlines and shutdown: ``docs/serving.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_afd.backends.base import Backend, RunSettings, run_settings_from
from pytest_afd.faults import applied_from_env
from pytest_afd.serving.connections import (
    RESOURCE_ERRNOS,
    CappedHTTPServer,
    default_max_connections,
    descriptor_budget,
)
from pytest_afd.serving.engine import DEFAULT_BATCH_WINDOW_S, DEFAULT_STALL_TIMEOUT_S, PrefillEngine
from pytest_afd.serving.handler import Handler
from pytest_afd.serving.requests import (
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_PROMPT_TOKENS,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_REQUEST_QUEUE_SIZE,
    ServingLimits,
)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
# After SIGTERM: how long past the request deadline to wait for answers being written.
SHUTDOWN_GRACE_S = 10.0
# How often the accept loop checks for a shutdown request: SIGTERM's drain starts within
# this, not within socketserver's default half second (an idle wake-up costs nothing).
SERVE_POLL_INTERVAL_S = 0.05
PEER_TIMEOUT_ENV = "AFD_PEER_TIMEOUT_S"
MAX_PEER_TIMEOUT_S = 86_400.0


class AfdHTTPServer(CappedHTTPServer):
    def __init__(self, address: tuple[str, int], engine: PrefillEngine, served_model_name: str,
                 limits: ServingLimits | None = None) -> None:
        self.limits = limits or ServingLimits()
        # Measured before the listening socket opens (FD_HEADROOM covers it).
        self.descriptor_budget = descriptor_budget()
        max_connections = self.limits.max_connections or default_max_connections(
            self.descriptor_budget)
        super().__init__(address, Handler, max_connections=max_connections,
                         request_queue_size=self.limits.request_queue_size)
        self.engine = engine
        self.served_model_name = served_model_name

    @property
    def schedulable_prompt_tokens(self) -> int:
        """Without chunked prefill a prompt must fit one step's token budget, which the
        scheduler charges in whole KV pages (page-granular admission, docs/chunk-planner.md)."""
        settings = self.engine.settings
        if settings.chunk_size is not None:
            return sys.maxsize
        return settings.max_num_batched_tokens // settings.block_size * settings.block_size

    def metrics_text(self) -> str:
        """The engine's vLLM-named counters plus this server's connection counters."""
        labels = f'model_name="{self.served_model_name}",engine="0"'
        lines = [self.engine.metrics_text(self.served_model_name).rstrip("\n"),
                 "# HELP afd:accept_errors_total accept() failures for want of descriptors "
                 "or memory (each one backed off).",
                 "# TYPE afd:accept_errors_total counter"]
        for code in sorted(RESOURCE_ERRNOS):
            name = errno.errorcode[code]
            count = self.accept_errors.get(name, 0)
            lines.append(f'afd:accept_errors_total{{{labels},errno="{name}"}} {float(count)}')
        for name, help_text, value in (
            ("afd:open_connections", "Client connections open now.", self.open_connections),
            ("afd:max_connections", "The connection cap.", self.max_connections),
        ):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge",
                      f"{name}{{{labels}}} {float(value)}"]
        return "\n".join(lines) + "\n"

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket],
                     client_address: Any) -> None:
        """A client that went away mid-answer is its own business, not a traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


def engine_settings(settings: RunSettings) -> RunSettings:
    """The server's backend always returns last-token logits: logprobs are computed from them."""
    return dataclasses.replace(settings, return_logits=True)


def check_loopback(host: str) -> str:
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"host={host!r}; this unauthenticated server binds loopback only "
                         f"({', '.join(LOOPBACK_HOSTS)})")
    return host


def settings_from_json(text: str) -> RunSettings:
    """RunSettings from the JSON the parent wrote with ``dataclasses.asdict``."""
    return run_settings_from(json.loads(text), "--settings-json")


def _argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse shows an ArgumentTypeError's message (a ValueError's becomes "invalid value")."""

    def parse_argument(text: str) -> Any:
        try:
            return parse(text)
        except (ValueError, TypeError) as error:
            raise argparse.ArgumentTypeError(str(error)) from error

    parse_argument.__name__ = parse.__name__
    return parse_argument


def _write_port_file(path: Path, port: int) -> None:
    """Atomic, so the parent never reads a half-written port."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(str(port))
    os.replace(temporary, path)


DESCRIPTION = (
    "Serve a harness backend (the CPU model by default) over an OpenAI-style HTTP API on "
    "loopback, without authentication: POST /v1/completions, GET /health, GET /metrics, "
    "GET /v1/models, POST /reset_prefix_cache, GET /afd/describe. On SIGTERM it finishes the "
    "running batch and answers 503 to queued requests. Limits and shutdown: docs/serving.md."
)
PROG = "python -m pytest_afd.serving.server"  # the old name; pytest-afd serve passes its own


def _build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    parser.add_argument("--backend", default="cpu",
                        help="backend to serve, by its harness name (default %(default)s)")
    parser.add_argument("--topology", default=None,
                        help="NPU topology to emulate, as for --npu-topology (e.g. dp3pcp8-ep8; "
                             "default: the backend's)")
    parser.add_argument("--model-name", default="reduced",
                        help="model profile to load (default %(default)s)")
    parser.add_argument("--served-model-name", default=None,
                        help="model name the API reports (default: --model-name)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the model's random weights (default %(default)s)")
    parser.add_argument("--results-dir", type=Path, default=Path("afd-results"),
                        help="directory for the backend's files (default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", type=_argument(check_loopback),
                        help="address to bind; loopback only (default %(default)s)")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path, default=None,
                        help="write the bound port to this file once listening")
    parser.add_argument("--batch-window-s", type=float, default=DEFAULT_BATCH_WINDOW_S,
                        help="how long to collect requests after the first one of a batch")
    parser.add_argument("--settings-json", type=_argument(settings_from_json), default=RunSettings(),
                        help="RunSettings as a JSON object (dataclasses.asdict)")
    limits = parser.add_argument_group("limits (docs/serving.md)")
    limits.add_argument("--max-prompt-tokens", type=_argument(_positive_int),
                        default=DEFAULT_MAX_PROMPT_TOKENS,
                        help="longer prompts are answered 400 (default %(default)s)")
    limits.add_argument("--max-batch-tokens", type=_argument(_positive_int),
                        default=DEFAULT_MAX_BATCH_TOKENS,
                        help="prompt tokens admitted into one engine batch (default %(default)s)")
    limits.add_argument("--vocab-size", type=_argument(_positive_int), default=None,
                        help="token ids must be below this (default: the vocabulary the "
                             "backend describes, model.config.vocab_size)")
    limits.add_argument("--request-queue-size", type=_argument(_positive_int),
                        default=DEFAULT_REQUEST_QUEUE_SIZE,
                        help="listen backlog (default %(default)s; the kernel caps it at "
                             "net.core.somaxconn)")
    limits.add_argument("--read-timeout-s", type=_argument(_positive_seconds),
                        default=DEFAULT_READ_TIMEOUT_S,
                        help="each request (header and body) must arrive within this many "
                             "seconds, else 408 and the connection is closed (default "
                             "%(default)s)")
    limits.add_argument("--max-connections", type=_argument(_positive_int), default=None,
                        help="open client connections at most; more wait in the listen "
                             "backlog (default: 256, lowered to the RLIMIT_NOFILE budget)")
    limits.add_argument("--stall-timeout-s", type=_argument(_positive_seconds),
                        default=DEFAULT_STALL_TIMEOUT_S,
                        help="/health answers 503 once one batch has run this long "
                             "(default %(default)s)")
    parser.add_argument("--afd-peer-timeout-s", type=_argument(peer_timeout_seconds),
                        default=None,
                        help="CPU AFD runtime (afd_processes): how long a rank waits for its "
                             f"peer before failing the batch (default ${PEER_TIMEOUT_ENV}, "
                             "else the runtime's 120 s)")
    return parser


def peer_timeout_seconds(text: str) -> float:
    """A peer timeout in seconds: a finite number in (0, 86,400]."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r}: expected a number of seconds") from None
    if not 0 < value <= MAX_PEER_TIMEOUT_S:
        raise ValueError(f"{text!r}: expected seconds in (0, {MAX_PEER_TIMEOUT_S:g}]")
    return value


def peer_timeout_from(flag: float | None, environ: Mapping[str, str]) -> float | None:
    """The flag, else ``$AFD_PEER_TIMEOUT_S`` (a bad value names the variable), else None."""
    if flag is not None:
        return flag
    text = environ.get(PEER_TIMEOUT_ENV, "")
    if not text.strip():
        return None
    try:
        return peer_timeout_seconds(text.strip())
    except ValueError as error:
        raise SystemExit(f"${PEER_TIMEOUT_ENV}={text!r}: {error}") from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1 or not text.strip().isascii():
        raise ValueError(f"{text!r}: expected a positive integer")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError(f"{text!r}: expected seconds > 0")
    return value


def described_vocab_size(description: dict[str, Any]) -> int | None:
    """The vocabulary a backend description records (``model.config.vocab_size``, as the CPU
    backend writes it); None when it records none (the backend then checks token ids)."""
    model = description.get("model")
    config = model.get("config") if isinstance(model, dict) else None
    return config.get("vocab_size") if isinstance(config, dict) else None


def limits_from_args(args: argparse.Namespace, backend: Backend) -> ServingLimits:
    vocab_size = args.vocab_size
    if vocab_size is None:
        vocab_size = described_vocab_size(backend.describe())
    return ServingLimits(vocab_size=vocab_size, max_prompt_tokens=args.max_prompt_tokens,
                         max_batch_tokens=args.max_batch_tokens,
                         request_queue_size=args.request_queue_size,
                         read_timeout_s=args.read_timeout_s,
                         max_connections=args.max_connections)


def make_backend(args: argparse.Namespace) -> Backend:
    from pytest_afd.backends import create_backend  # lazy: the CPU backend imports torch

    topology = None
    if args.topology is not None:
        from pytest_afd.topology import parse_topology

        topology = parse_topology(args.topology)
    return create_backend(args.backend, topology=topology, model_name=args.model_name,
                          seed=args.seed, results_dir=args.results_dir,
                          peer_timeout_s=peer_timeout_from(args.afd_peer_timeout_s, os.environ))


def serve(backend: Backend, settings: RunSettings, *, host: str, port: int,
          served_model_name: str, port_file: Path | None = None,
          batch_window_s: float = DEFAULT_BATCH_WINDOW_S,
          limits: ServingLimits | None = None,
          stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S) -> None:
    """Serve until SIGTERM/SIGINT, then drain (:func:`drain`); the backend is closed last."""
    limits = limits or ServingLimits()
    engine = PrefillEngine(backend, engine_settings(settings), batch_window_s,
                           limits.max_batch_tokens, stall_timeout_s)
    engine.start()
    httpd = AfdHTTPServer((host, port), engine, served_model_name, limits)

    def shutdown(signum: int, frame: object) -> None:
        httpd.stopping = True
        engine.begin_stop()
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    bound_port = httpd.server_address[1]
    budget = httpd.descriptor_budget
    print(f"serving {served_model_name} ({backend.name}) on http://{host}:{bound_port}; "
          f"at most {httpd.max_connections} connections (descriptor budget {budget}), "
          f"request deadline {limits.read_timeout_s:g} s", flush=True)
    if httpd.max_connections > budget:
        print(f"warning: --max-connections {httpd.max_connections} exceeds the descriptor "
              f"budget {budget}: accept will back off on EMFILE", file=sys.stderr, flush=True)
    if port_file is not None:
        _write_port_file(port_file, bound_port)
    try:
        httpd.serve_forever(poll_interval=SERVE_POLL_INTERVAL_S)
    finally:
        drain(httpd, engine)
        backend.close()


def drain(httpd: AfdHTTPServer, engine: PrefillEngine) -> None:
    """Stop accepting; the running batch finishes and is answered, every queued request
    gets 503; wait (bounded) until those answers are written."""
    httpd.stopping = True
    httpd.server_close()  # connections not yet accepted are refused, not left hanging
    engine.stop()
    unanswered = httpd.wait_answered(httpd.limits.read_timeout_s + SHUTDOWN_GRACE_S)
    if unanswered:
        print(f"shutdown: {unanswered} request(s) still unanswered after the grace period",
              file=sys.stderr, flush=True)


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """``pytest-afd serve`` (``prog``) and the old ``python -m pytest_afd.serving.server``."""
    args = _build_parser(prog).parse_args(argv)
    backend = make_backend(args)
    # A seeded split-path fault named by $PYTEST_AFD_FAULT (tests: a broken candidate
    # deployment the gates must reject); nothing is patched when it is unset.
    with applied_from_env() as fault:
        if fault is not None:
            print(f"seeded fault {fault.name!r} applied for this server's lifetime", flush=True)
        serve(backend, args.settings_json, host=args.host, port=args.port,
              served_model_name=args.served_model_name or args.model_name,
              port_file=args.port_file, batch_window_s=args.batch_window_s,
              limits=limits_from_args(args, backend), stall_timeout_s=args.stall_timeout_s)
    return 0


if __name__ == "__main__":
    from pytest_afd.cli.aliases import warn

    warn("python -m pytest_afd.serving.server", "pytest-afd serve")
    sys.exit(main())
