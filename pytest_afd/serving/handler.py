"""The HTTP handler of the CPU server: routes, answers, and what a client may see.

HTTP/1.1 with keep-alive: every answer carries a ``Content-Length`` except the
SSE stream, which closes its connection. Each request (header and body, and on
a kept-alive connection the wait for it) must arrive within ``read_timeout_s``
(:class:`~pytest_afd.serving.connections.DeadlineReader`). A failure reaches the
client as one line without tracebacks or file paths; the full text goes to the
server log under the request id. See ``docs/serving.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import sys
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

from pytest_afd.core.backend import PromptRequest, RequestOutput
from pytest_afd.core.code_identity import running_code
from pytest_afd.serving.connections import WRITE_TIMEOUT_S, DeadlineReader, peer_closed
from pytest_afd.serving.engine import EngineStopped, PrefillEngine, RequestAborted
from pytest_afd.serving.logprobs import MAX_NUM_LOGPROBS, completion_logprobs
from pytest_afd.serving.requests import (
    INSTRUMENT_HEADER,
    INSTRUMENT_ON,
    PREFILL_MAX_TOKENS,
    STAND_IN_FIELD,
    BadRequest,
    ServingLimits,
    check_prompt,
    parse_completion_request,
    parse_json_body,
    read_body,
)

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SSE_DONE = b"data: [DONE]\n\n"
# What a client sees of a failure: its first line, this long at most.
MAX_CLIENT_ERROR_CHARS = 300
# An absolute path (a source file, a checkout) in an error text: never sent to clients.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[\w.+~-]+/)+[\w.+~-]*")


class HandlerServer(Protocol):
    """What the handler needs of its server (``server.AfdHTTPServer``), so the two
    modules meet here instead of importing each other."""

    limits: ServingLimits
    engine: PrefillEngine
    served_model_name: str
    stopping: bool

    @property
    def schedulable_prompt_tokens(self) -> int: ...

    def metrics_text(self) -> str: ...

    def answering(self) -> contextlib.AbstractContextManager[None]: ...

RETRY_AFTER_S = "5"
# The stand-in label's device before the server has an engine to ask (still a stand-in).
STAND_IN_UNKNOWN_DEVICE = "unknown (pytest-afd server)"


def client_message(error_text: str) -> str:
    """The part of an error a client may see: the first line, paths masked, bounded.

    The rest (a rank's traceback, file paths) is for the server log only.
    """
    first = next((line.strip() for line in error_text.splitlines() if line.strip()), "")
    first = _ABSOLUTE_PATH.sub("<path>", first)
    if len(first) > MAX_CLIENT_ERROR_CHARS:
        first = first[:MAX_CLIENT_ERROR_CHARS] + "..."
    return f"{first} (details in the server log)" if first else "see the server log"


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


class Handler(BaseHTTPRequestHandler):
    server: HandlerServer  # type: ignore[assignment]
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.timeout = self.server.limits.read_timeout_s
        super().setup()
        self._reader = DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)
        self._reading_body = False

    def handle_one_request(self) -> None:
        """One request on this connection, all of it within the request deadline."""
        self._reader.start(self.server.limits.read_timeout_s)
        self._reading_body = False
        super().handle_one_request()  # a TimeoutError reading the header closes the connection
        if self._reader.expired and self._reader.received and not self._reading_body:
            self._answer_header_timeout()
        if self.server.stopping:
            self.close_connection = True

    def _answer_header_timeout(self) -> None:
        """408 for a header not received in time (best effort: the client may be gone)."""
        self._reader.clear(WRITE_TIMEOUT_S)
        self.close_connection = True
        try:
            self._send_error_json(HTTPStatus.REQUEST_TIMEOUT, "request header not received "
                                  f"within {self.server.limits.read_timeout_s} s")
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")

    def _send_json(self, status: HTTPStatus, payload: dict[str, Any],
                   extra_headers: tuple[tuple[str, str], ...] = ()) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra_headers:
            self.send_header(name, value)
        if self.close_connection or self.server.stopping:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _send_error_json(self, status: HTTPStatus, message: str,
                         extra_headers: tuple[tuple[str, str], ...] = ()) -> None:
        self._send_json(status, {"error": {"message": message, "type": status.phrase,
                                           "code": int(status)}}, extra_headers)

    def _send_failure(self, request_id: str, what: str, error_text: str) -> None:
        """500 with the one-line, path-free message; the whole text goes to the log."""
        self.log_error("%s: %s failed:\n%s", request_id, what, error_text)
        self._send_error_json(HTTPStatus.INTERNAL_SERVER_ERROR,
                              f"{what} failed: {client_message(error_text)}")

    def _read_json_body(self) -> dict[str, Any]:
        """The body as JSON; a client error closes the connection (its stream is out of step)."""
        self._reading_body = True
        try:
            body = parse_json_body(read_body(self.rfile, self.headers))
        except BadRequest:
            self.close_connection = True
            raise
        except TimeoutError:
            self.close_connection = True
            self._reader.clear(WRITE_TIMEOUT_S)
            self._send_error_json(
                HTTPStatus.REQUEST_TIMEOUT,
                f"body not received within {self.server.limits.read_timeout_s} s "
                f"(Content-Length {self.headers.get('Content-Length')}; the whole request "
                "must arrive within it)",
            )
            raise
        self._reader.clear(WRITE_TIMEOUT_S)
        return body

    def do_GET(self) -> None:
        self._reader.clear(WRITE_TIMEOUT_S)
        engine = self.server.engine
        if self.path == "/health":
            reason = engine.unhealthy_reason()
            if reason is None:
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._send_error_json(HTTPStatus.SERVICE_UNAVAILABLE, reason)
        elif self.path == "/metrics":
            body = self.server.metrics_text().encode()
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", PROMETHEUS_CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/v1/models":
            # The stand-in label (STAND_IN_FIELD): this server is never hardware, in any mode.
            self._send_json(HTTPStatus.OK, {"object": "list", "data": [
                {"id": self.server.served_model_name, "object": "model",
                 "root": self.server.served_model_name, "owned_by": "pytest-afd",
                 STAND_IN_FIELD: self._stand_in_label()}]})
        elif self.path == "/afd/describe":
            self._send_json(HTTPStatus.OK, {
                "backend": engine.backend.describe(),
                "settings": dataclasses.asdict(engine.settings),
                # Which interpreter and pytest_afd this server imported: an A/B run of two
                # code versions records it per side (pytest_afd.run.ab_sides).
                "code": running_code(),
            })
        else:
            self._send_error_json(HTTPStatus.NOT_FOUND, f"no route GET {self.path}")

    def _stand_in_label(self) -> dict[str, str]:
        """``{"device": ...}`` of this server: its engine backend's device (asked once), or
        ``STAND_IN_UNKNOWN_DEVICE`` before an engine is attached; never absent."""
        label = getattr(self.server, "stand_in_label", None)
        if label is None:
            engine = self.server.engine
            device = None if engine is None else engine.backend.describe().get("device")
            label = {"device": str(device or STAND_IN_UNKNOWN_DEVICE)}
            if engine is not None:
                self.server.stand_in_label = label
        return label

    def do_POST(self) -> None:
        with self.server.answering():
            self._post()

    def _post(self) -> None:
        if self.path == "/reset_prefix_cache":
            self._reader.clear(WRITE_TIMEOUT_S)
            try:
                self.server.engine.reset_prefix_cache()
            except Exception as error:
                self._send_failure("reset_prefix_cache", "reset", str(error))
                return
            self._send_json(HTTPStatus.OK, {"reset": True})
            return
        if self.path != "/v1/completions":
            self.close_connection = True  # its body, if any, was not read
            self._send_error_json(HTTPStatus.NOT_FOUND, f"no route POST {self.path}")
            return
        try:
            body = self._read_json_body()
            token_ids, stream, include_usage = parse_completion_request(
                body, self.server.served_model_name)
            num_logprobs = parse_logprobs_request(body)
            check_prompt(token_ids, self.server.limits, self.server.schedulable_prompt_tokens)
        except BadRequest as error:  # bad JSON, a bad Content-Length or a bad field
            self._reader.clear(WRITE_TIMEOUT_S)
            self._send_error_json(error.status, str(error))
            return
        except TimeoutError:
            return  # _read_json_body answered 408 and closes the connection
        request_id = self.headers.get("X-Request-Id") or f"cmpl-{uuid.uuid4().hex}"
        # Internal ids stay unique even when clients reuse theirs.
        prompt = PromptRequest(f"{request_id}#{uuid.uuid4().hex[:8]}", token_ids)
        connection = self.connection
        try:
            instrument = self.headers.get(INSTRUMENT_HEADER) == INSTRUMENT_ON
            output = self.server.engine.submit(
                prompt, lambda: peer_closed(connection),
                self.server.accept_number(connection), instrument).result()
        except RequestAborted as error:
            self.log_error("%s", error)
            self.close_connection = True  # nobody is listening
            return
        except EngineStopped as error:
            self._send_error_json(HTTPStatus.SERVICE_UNAVAILABLE, str(error),
                                  (("Retry-After", RETRY_AFTER_S),))
            return
        except Exception as error:
            self._send_failure(request_id, "prefill", f"{type(error).__name__}: {error}")
            return
        if output.error is not None:
            self._send_failure(request_id, "prefill", output.error)
            return
        try:
            choice = with_logprobs(_choice(output), output, num_logprobs)
        except RuntimeError as error:
            self._send_failure(request_id, "logprobs", str(error))
            return
        response = {"id": request_id, "object": "text_completion", "created": int(time.time()),
                    "model": self.server.served_model_name, "choices": [choice]}
        if not stream:
            self._send_json(HTTPStatus.OK, {**response, "usage": _usage(output)})
            return
        self._send_stream(response, output, include_usage)

    def _send_stream(self, response: dict[str, Any], output: RequestOutput,
                     include_usage: bool) -> None:
        """SSE has no length up front: the stream ends with its connection."""
        self.close_connection = True
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(f"data: {json.dumps(response)}\n\n".encode())
        if include_usage:
            usage_chunk = {**response, "choices": [], "usage": _usage(output)}
            self.wfile.write(f"data: {json.dumps(usage_chunk)}\n\n".encode())
        self.wfile.write(SSE_DONE)
        self.wfile.flush()
