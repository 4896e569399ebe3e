"""Serve any :class:`~pytest_afd.backends.base.Backend` over an OpenAI-style HTTP API.

The same client, lifecycle and metrics code then runs against the CPU backend
here and against vLLM-Ascend on a cluster. Endpoints (loopback only; there is no
authentication): ``POST /v1/completions`` (prompt token ids, ``max_tokens=1``,
optional SSE streaming), ``GET /health``, ``GET /metrics`` (vLLM counter names),
``GET /v1/models``, ``POST /reset_prefix_cache`` and ``GET /afd/describe``.

Concurrent requests are queued and prefilled together by one engine thread, the
way a serving scheduler batches waiting prefills: everything that is waiting
when the previous batch finishes (up to ``max_num_seqs`` requests and
``--max-batch-tokens`` prompt tokens) forms the next batch. Requests are
validated while they are read (:mod:`pytest_afd.serving.requests`), and a
batch the backend fails is rerun request by request, so one bad request fails
only itself. Limits, backlog and timeouts: ``docs/serving.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pytest_afd.backends.base import Backend, PromptRequest, RequestOutput, RunSettings
from pytest_afd.serving.engine import DEFAULT_BATCH_WINDOW_S, PrefillEngine
from pytest_afd.serving.requests import (
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_MAX_PROMPT_TOKENS,
    DEFAULT_READ_TIMEOUT_S,
    DEFAULT_REQUEST_QUEUE_SIZE,
    PREFILL_MAX_TOKENS,
    BadRequest,
    ServingLimits,
    check_prompt,
    parse_completion_request,
    parse_json_body,
    read_body,
)

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SSE_DONE = b"data: [DONE]\n\n"


def _usage(output: RequestOutput) -> dict[str, Any]:
    return {
        "prompt_tokens": output.num_prompt_tokens,
        "completion_tokens": PREFILL_MAX_TOKENS,
        "total_tokens": output.num_prompt_tokens + PREFILL_MAX_TOKENS,
        "prompt_tokens_details": {"cached_tokens": output.num_cached_tokens},
    }


def _choice(output: RequestOutput) -> dict[str, Any]:
    return {"index": 0, "text": "", "token_ids": [output.next_token], "logprobs": None,
            "finish_reason": "length", "stop_reason": None}


class _Handler(BaseHTTPRequestHandler):
    server: AfdHTTPServer  # type: ignore[assignment]

    def setup(self) -> None:
        # StreamRequestHandler applies ``timeout`` to the socket: a stalled read
        # (a body shorter than its Content-Length, held open) raises TimeoutError.
        self.timeout = self.server.limits.read_timeout_s
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def _send_json(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_error_json(self, status: HTTPStatus, message: str) -> None:
        self._send_json(status, {"error": {"message": message, "type": status.phrase,
                                           "code": int(status)}})

    def _read_json_body(self) -> dict[str, Any]:
        """The body as JSON; a client error closes the connection (its stream is out of step)."""
        try:
            return parse_json_body(read_body(self.rfile, self.headers))
        except BadRequest:
            self.close_connection = True
            raise
        except TimeoutError:
            self.close_connection = True
            self._send_error_json(
                HTTPStatus.REQUEST_TIMEOUT,
                f"body not received within {self.server.limits.read_timeout_s} s "
                f"(Content-Length {self.headers.get('Content-Length')})",
            )
            raise

    def do_GET(self) -> None:
        engine = self.server.engine
        if self.path == "/health":
            status = HTTPStatus.OK if engine.healthy else HTTPStatus.SERVICE_UNAVAILABLE
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/metrics":
            body = engine.metrics_text(self.server.served_model_name).encode()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", PROMETHEUS_CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/v1/models":
            self._send_json(HTTPStatus.OK, {"object": "list", "data": [
                {"id": self.server.served_model_name, "object": "model",
                 "root": self.server.served_model_name, "owned_by": "pytest-afd"}]})
        elif self.path == "/afd/describe":
            self._send_json(HTTPStatus.OK, {
                "backend": engine.backend.describe(),
                "settings": dataclasses.asdict(engine.settings),
            })
        else:
            self._send_error_json(HTTPStatus.NOT_FOUND, f"no route GET {self.path}")

    def do_POST(self) -> None:
        if self.path == "/reset_prefix_cache":
            try:
                self.server.engine.reset_prefix_cache()
            except Exception as error:
                self._send_error_json(HTTPStatus.INTERNAL_SERVER_ERROR, f"reset failed: {error}")
                return
            self._send_json(HTTPStatus.OK, {"reset": True})
            return
        if self.path != "/v1/completions":
            self._send_error_json(HTTPStatus.NOT_FOUND, f"no route POST {self.path}")
            return
        try:
            body = self._read_json_body()
            token_ids, stream, include_usage = parse_completion_request(
                body, self.server.served_model_name)
        except BadRequest as error:  # bad JSON, a bad Content-Length or a bad field
            self._send_error_json(error.status, str(error))
            return
        except TimeoutError:
            return  # _read_json_body answered 408 and closes the connection
        try:
            check_prompt(token_ids, self.server.limits, self.server.schedulable_prompt_tokens)
        except BadRequest as error:
            self._send_error_json(error.status, str(error))
            return
        request_id = self.headers.get("X-Request-Id") or f"cmpl-{uuid.uuid4().hex}"
        # Internal ids stay unique even when clients reuse theirs.
        prompt = PromptRequest(f"{request_id}#{uuid.uuid4().hex[:8]}", token_ids)
        try:
            output = self.server.engine.submit(prompt).result()
        except Exception as error:
            self._send_error_json(HTTPStatus.INTERNAL_SERVER_ERROR, f"prefill failed: {error}")
            return
        if output.error is not None:
            self._send_error_json(HTTPStatus.INTERNAL_SERVER_ERROR, output.error)
            return
        response = {"id": request_id, "object": "text_completion", "created": int(time.time()),
                    "model": self.server.served_model_name, "choices": [_choice(output)]}
        if not stream:
            self._send_json(HTTPStatus.OK, {**response, "usage": _usage(output)})
            return
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.write(f"data: {json.dumps(response)}\n\n".encode())
        if include_usage:
            usage_chunk = {**response, "choices": [], "usage": _usage(output)}
            self.wfile.write(f"data: {json.dumps(usage_chunk)}\n\n".encode())
        self.wfile.write(SSE_DONE)
        self.wfile.flush()


class AfdHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], engine: PrefillEngine, served_model_name: str,
                 limits: ServingLimits | None = None) -> None:
        self.limits = limits or ServingLimits()
        # listen() takes socketserver's backlog (default 5) when the base class binds.
        self.request_queue_size = self.limits.request_queue_size
        super().__init__(address, _Handler)
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

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket],
                     client_address: Any) -> None:
        """A client that went away mid-answer is its own business, not a traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


def check_loopback(host: str) -> str:
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"host={host!r}; this unauthenticated server binds loopback only "
                         f"({', '.join(LOOPBACK_HOSTS)})")
    return host


def settings_from_json(text: str) -> RunSettings:
    """RunSettings from the JSON the parent wrote with ``dataclasses.asdict``."""
    values = json.loads(text)
    if not isinstance(values, dict):
        raise ValueError(f"--settings-json must be a JSON object, got {text!r}")
    known = {item.name for item in dataclasses.fields(RunSettings)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"--settings-json has unknown RunSettings fields {unknown}; known: {sorted(known)}")
    return RunSettings(**values)


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


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cpu", help="backend name for create_backend")
    parser.add_argument("--topology", default=None, help="--npu-topology string to emulate")
    parser.add_argument("--model-name", default="reduced")
    parser.add_argument("--served-model-name", default=None, help="defaults to --model-name")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", type=Path, default=Path("afd-results"))
    parser.add_argument("--host", default="127.0.0.1", type=_argument(check_loopback))
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", type=Path, default=None,
                        help="write the bound port here once listening")
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
                        help="a connection silent this long is answered 408 and closed "
                             "(default %(default)s)")
    return parser


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
                         read_timeout_s=args.read_timeout_s)


def make_backend(args: argparse.Namespace) -> Backend:
    from pytest_afd.backends import create_backend  # lazy: the CPU backend imports torch

    topology = None
    if args.topology is not None:
        from pytest_afd.topology import parse_topology

        topology = parse_topology(args.topology)
    return create_backend(args.backend, topology=topology, model_name=args.model_name,
                          seed=args.seed, results_dir=args.results_dir)


def serve(backend: Backend, settings: RunSettings, *, host: str, port: int,
          served_model_name: str, port_file: Path | None = None,
          batch_window_s: float = DEFAULT_BATCH_WINDOW_S,
          limits: ServingLimits | None = None) -> None:
    """Serve until SIGTERM/SIGINT; the backend is closed on the way out."""
    limits = limits or ServingLimits()
    engine = PrefillEngine(backend, settings, batch_window_s, limits.max_batch_tokens)
    engine.start()
    httpd = AfdHTTPServer((host, port), engine, served_model_name, limits)

    def shutdown(signum: int, frame: object) -> None:
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    bound_port = httpd.server_address[1]
    print(f"serving {served_model_name} ({backend.name}) on http://{host}:{bound_port}", flush=True)
    if port_file is not None:
        _write_port_file(port_file, bound_port)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()
        engine.stop()
        backend.close()


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    backend = make_backend(args)
    serve(backend, args.settings_json, host=args.host, port=args.port,
          served_model_name=args.served_model_name or args.model_name, port_file=args.port_file,
          batch_window_s=args.batch_window_s, limits=limits_from_args(args, backend))
    return 0


if __name__ == "__main__":
    sys.exit(main())
