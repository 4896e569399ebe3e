"""Serve any :class:`~pytest_afd.backends.base.Backend` over an OpenAI-style HTTP API.

The same client, lifecycle and metrics code then runs against the CPU backend
here and against vLLM-Ascend on a cluster. Endpoints (loopback only; there is no
authentication): ``POST /v1/completions`` (prompt token ids, ``max_tokens=1``,
optional SSE streaming), ``GET /health``, ``GET /metrics`` (vLLM counter names),
``GET /v1/models``, ``POST /reset_prefix_cache`` and ``GET /afd/describe``.

Concurrent requests are queued and prefilled together by one engine thread, the
way a serving scheduler batches waiting prefills: everything that is waiting
when the previous batch finishes (up to ``max_num_seqs``) forms the next batch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import queue
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pytest_afd.backends.base import Backend, PromptRequest, RequestOutput, RunSettings
from pytest_afd.faults import applied_from_env
from pytest_afd.serving.logprobs import MAX_NUM_LOGPROBS, completion_logprobs

PREFILL_MAX_TOKENS = 1
LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
ENGINE_IDLE_POLL_S = 0.2
# How long the engine keeps collecting after the first waiting request. A burst
# of concurrent clients reaches the server over a few milliseconds; without a
# window the first request of an all-at-once burst would be prefilled alone.
DEFAULT_BATCH_WINDOW_S = 0.02
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SSE_DONE = b"data: [DONE]\n\n"


class BadRequest(ValueError):
    """The request body breaks the API contract; answered with HTTP 400."""


@dataclass
class _Pending:
    prompt: PromptRequest
    future: Future[RequestOutput]


@dataclass
class _Counters:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    request_success: int = 0
    request_failure: int = 0
    batches: int = 0
    submitted: int = 0
    running: int = 0  # requests in the batch the backend is running now


class PrefillEngine:
    """Owns the backend: every backend call happens on this one thread."""

    def __init__(self, backend: Backend, settings: RunSettings,
                 batch_window_s: float = DEFAULT_BATCH_WINDOW_S) -> None:
        self.backend = backend
        self.settings = settings
        self.batch_window_s = batch_window_s
        self._deferred: Callable[[], None] | None = None
        self._queue: queue.Queue[_Pending | Callable[[], None]] = queue.Queue()
        self._lock = threading.Lock()
        self._counters = _Counters()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="prefill-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive()

    def submit(self, prompt: PromptRequest) -> Future[RequestOutput]:
        future: Future[RequestOutput] = Future()
        with self._lock:
            self._counters.submitted += 1
        self._queue.put(_Pending(prompt, future))
        return future

    def reset_prefix_cache(self) -> None:
        """Runs between batches so a reset never races a forward."""
        done: Future[None] = Future()

        def reset() -> None:
            try:
                self.backend.reset_prefix_cache()
            except Exception as error:  # reported to the caller; the engine keeps running
                done.set_exception(error)
                return
            done.set_result(None)

        self._queue.put(reset)
        done.result()

    def counters(self) -> _Counters:
        with self._lock:
            return dataclasses.replace(self._counters)

    def _next_batch(self) -> list[_Pending] | Callable[[], None] | None:
        """The next control item, or the requests that arrive within the batch window."""
        if self._deferred is not None:
            control, self._deferred = self._deferred, None
            return control
        try:
            first = self._queue.get(timeout=ENGINE_IDLE_POLL_S)
        except queue.Empty:
            return None
        if not isinstance(first, _Pending):
            return first
        batch = [first]
        deadline = time.monotonic() + self.batch_window_s
        while len(batch) < self.settings.max_num_seqs:
            try:
                item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                break
            if not isinstance(item, _Pending):
                self._deferred = item  # runs right after this batch
                break
            batch.append(item)
        return batch

    def _loop(self) -> None:
        while not self._stopping.is_set():
            work = self._next_batch()
            if work is None:
                continue
            if callable(work):
                work()
                continue
            self._run_batch(work)

    def _run_batch(self, batch: list[_Pending]) -> None:
        with self._lock:
            self._counters.running = len(batch)
        try:
            outputs = self.backend.run([pending.prompt for pending in batch], self.settings)
        except Exception as error:  # one failing batch fails its requests, not the server
            with self._lock:
                self._counters.running = 0
                self._counters.request_failure += len(batch)
            for pending in batch:
                pending.future.set_exception(error)
            return
        by_id = outputs.by_id()
        missing = RuntimeError("the backend returned no output for this request")
        with self._lock:
            self._counters.running = 0
            self._counters.batches += 1
            for pending in batch:
                output = by_id.get(pending.prompt.request_id)
                if output is not None and output.error is None:
                    self._counters.request_success += 1
                    self._counters.prompt_tokens += output.num_prompt_tokens
                    self._counters.cached_tokens += output.num_cached_tokens
                else:
                    self._counters.request_failure += 1
        for pending in batch:
            output = by_id.get(pending.prompt.request_id)
            if output is None:
                pending.future.set_exception(missing)
            else:
                pending.future.set_result(output)

    def metrics_text(self, model_name: str) -> str:
        """vLLM's counter names, so the same scraper reads this server and vLLM."""
        counters = self.counters()
        labels = f'model_name="{model_name}",engine="0"'
        rows = [
            ("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in tokens.",
             f"{{{labels}}}", counters.prompt_tokens),
            ("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in tokens.",
             f"{{{labels}}}", counters.cached_tokens),
            ("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
             f"{{{labels}}}", counters.prompt_tokens),
            ("vllm:request_success", "counter", "Count of successfully processed requests.",
             f'{{{labels},finished_reason="length"}}', counters.request_success),
            ("afd:request_failure", "counter", "Requests whose prefill failed.",
             f"{{{labels}}}", counters.request_failure),
            ("afd:prefill_batches", "counter", "Backend prefill batches run.",
             f"{{{labels}}}", counters.batches),
        ]
        lines = []
        for name, kind, help_text, label_text, value in rows:
            lines += [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total {kind}",
                      f"{name}_total{label_text} {float(value)}"]
        finished = counters.request_success + counters.request_failure
        waiting = counters.submitted - finished - counters.running
        for name, help_text, value in (
            ("vllm:num_requests_running", "Requests in the batch being prefilled.", counters.running),
            ("vllm:num_requests_waiting", "Requests queued for the next batch.", waiting),
        ):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge",
                      f"{name}{{{labels}}} {float(value)}"]
        return "\n".join(lines) + "\n"


def parse_completion_request(body: dict[str, Any], served_model_name: str) -> tuple[tuple[int, ...], bool, bool]:
    """Validate a ``/v1/completions`` body; returns (token ids, stream, include_usage)."""
    model = body.get("model", served_model_name)
    if model != served_model_name:
        raise BadRequest(f"model={model!r}; this server serves {served_model_name!r}")
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(
        isinstance(token, int) and not isinstance(token, bool) and token >= 0 for token in prompt
    ):
        raise BadRequest(
            f"prompt must be a non-empty list of token ids (non-negative ints); got "
            f"{type(prompt).__name__} {str(prompt)[:80]!r}"
        )
    max_tokens = body.get("max_tokens", PREFILL_MAX_TOKENS)
    if max_tokens != PREFILL_MAX_TOKENS:
        raise BadRequest(
            f"max_tokens={max_tokens!r}; this prefill-only server generates exactly "
            f"{PREFILL_MAX_TOKENS} token"
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream={stream!r}; expected a boolean")
    stream_options = body.get("stream_options") or {}
    include_usage = bool(stream_options.get("include_usage", False))
    return tuple(prompt), stream, include_usage


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


def parse_logprobs_request(body: dict[str, Any]) -> int | None:
    """``logprobs`` (top-k of the generated token) as vLLM accepts it; prompt_logprobs refused.

    Tokens are always returned as ``"token_id:<id>"`` (this server has no
    tokenizer), so ``return_tokens_as_token_ids`` must be true when asking.
    """
    if body.get("prompt_logprobs") is not None:
        raise BadRequest(f"prompt_logprobs={body['prompt_logprobs']!r}: this server returns only "
                         "the generated token's logprobs (its backend gives last-token logits)")
    k = body.get("logprobs")
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_NUM_LOGPROBS:
        raise BadRequest(f"logprobs={k!r}; expected an integer in 0..{MAX_NUM_LOGPROBS}")
    if body.get("return_tokens_as_token_ids") is not True:
        raise BadRequest("logprobs needs return_tokens_as_token_ids=true: this server has no "
                         "tokenizer to spell tokens as text")
    return k


def with_logprobs(choice: dict[str, Any], output: RequestOutput, k: int | None) -> dict[str, Any]:
    """The choice with vLLM's ``logprobs`` object when the request asked for ``k`` of them."""
    if k is None:
        return choice
    if output.logits is None:
        raise RuntimeError("the backend returned no logits, so no logprobs can be computed")
    return {**choice, "logprobs": completion_logprobs(output.logits, output.next_token, k)}


def engine_settings(settings: RunSettings) -> RunSettings:
    """The server's backend always returns last-token logits: logprobs are computed from them."""
    return dataclasses.replace(settings, return_logits=True)


class _Handler(BaseHTTPRequestHandler):
    server: AfdHTTPServer  # type: ignore[assignment]

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
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"null")
            if not isinstance(body, dict):
                raise BadRequest(f"body must be a JSON object, got {type(body).__name__}")
            token_ids, stream, include_usage = parse_completion_request(
                body, self.server.served_model_name)
            num_logprobs = parse_logprobs_request(body)
        except ValueError as error:  # BadRequest, bad JSON or a bad Content-Length
            self._send_error_json(HTTPStatus.BAD_REQUEST, str(error))
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
        try:
            choice = with_logprobs(_choice(output), output, num_logprobs)
        except RuntimeError as error:
            self._send_error_json(HTTPStatus.INTERNAL_SERVER_ERROR, str(error))
            return
        response = {"id": request_id, "object": "text_completion", "created": int(time.time()),
                    "model": self.server.served_model_name, "choices": [choice]}
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

    def __init__(self, address: tuple[str, int], engine: PrefillEngine, served_model_name: str) -> None:
        super().__init__(address, _Handler)
        self.engine = engine
        self.served_model_name = served_model_name


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
    return parser


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
          batch_window_s: float = DEFAULT_BATCH_WINDOW_S) -> None:
    """Serve until SIGTERM/SIGINT; the backend is closed on the way out."""
    engine = PrefillEngine(backend, engine_settings(settings), batch_window_s)
    engine.start()
    httpd = AfdHTTPServer((host, port), engine, served_model_name)

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
    # A seeded split-path fault named by $PYTEST_AFD_FAULT (tests: a broken candidate
    # deployment the gates must reject); nothing is patched when it is unset.
    with applied_from_env() as fault:
        if fault is not None:
            print(f"seeded fault {fault.name!r} applied for this server's lifetime", flush=True)
        serve(backend, args.settings_json, host=args.host, port=args.port,
              served_model_name=args.served_model_name or args.model_name,
              port_file=args.port_file, batch_window_s=args.batch_window_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
