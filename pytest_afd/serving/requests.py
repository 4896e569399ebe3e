"""Reading and validating one ``/v1/completions`` request, before it reaches the engine.

Everything a client can get wrong is answered 400 for that request alone (the
message names the field): a body shorter than its ``Content-Length``, JSON
that is not an object or is nested too deeply, a token id outside the
vocabulary, a prompt longer than the server admits. What the engine batches
has passed these checks, so one bad request cannot fail the others. See
``docs/serving.md`` ("Limits").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from email.message import Message
from http import HTTPStatus
from typing import Any, BinaryIO

PREFILL_MAX_TOKENS = 1
# The harness's instrumented run marks its requests; vLLM ignores an unknown header, the
# harness's own CPU server profiles the batches holding one (docs/profiling.md).
INSTRUMENT_HEADER = "X-AFD-Instrument"
INSTRUMENT_ON = "1"
# The harness's own server labels each ``/v1/models`` entry with the device it runs on
# (``{"device": "cpu"}``): it stands in for a deployment in every mode (launched, attached
# through a URL, deployed by a command), and a client reads this label instead of trusting
# the mode. A vLLM deployment has no such key.
STAND_IN_FIELD = "afd_stand_in"
# One prompt at most this many tokens: the CPU backend prefills about 250
# tokens/s with the reduced model, so 4,096 tokens hold the engine ~15 s at worst.
DEFAULT_MAX_PROMPT_TOKENS = 4096
# The engine admits waiting requests into a batch up to this many prompt tokens
# (a longer prompt runs alone): requests queued before a long prompt are not
# held back by it.
DEFAULT_MAX_BATCH_TOKENS = 4096
# Listen backlog (socketserver's default is 5: a burst of 16 clients lost one).
DEFAULT_REQUEST_QUEUE_SIZE = 512
# Each request, header and body, must arrive within this long (a body shorter
# than its Content-Length held open, a header sent a byte a second): else 408.
DEFAULT_READ_TIMEOUT_S = 30.0
# A request body: a JSON token list needs at most ~12 bytes per token.
MAX_BODY_BYTES = 1 << 24
# Completion bodies are flat objects; deeper JSON is refused, never a crash.
MAX_JSON_DEPTH = 16
# Longer digit strings are refused before int() (which gives up past 4,300 digits).
MAX_CONTENT_LENGTH_DIGITS = 20


class BadRequest(ValueError):
    """The request breaks the API contract; answered with ``status`` (400 unless said)."""

    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ServingLimits:
    """What one server admits; every limit is a server flag (``--max-prompt-tokens`` ...)."""

    vocab_size: int | None = None  # None: token ids are checked by the backend only
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    request_queue_size: int = DEFAULT_REQUEST_QUEUE_SIZE
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S  # the whole request (header and body)
    max_connections: int | None = None  # None: the default lowered to the descriptor budget

    def __post_init__(self) -> None:
        for name in ("max_prompt_tokens", "max_batch_tokens", "request_queue_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected a positive integer")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"max_connections={self.max_connections!r}; expected a positive "
                             "integer or None")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size={self.vocab_size!r}; expected a positive integer or None")
        if not self.read_timeout_s > 0:
            raise ValueError(f"read_timeout_s={self.read_timeout_s!r}; expected seconds > 0")


def content_length_text(headers: Message) -> str:
    """The one ``Content-Length`` value; repeated headers must agree (RFC 9110 8.6), else 400.

    Two differing lengths are the classic request-smuggling split: this
    server and a proxy in front of it could each believe a different one.
    """
    values = headers.get_all("Content-Length")
    if not values:
        raise BadRequest("Content-Length header is required", HTTPStatus.LENGTH_REQUIRED)
    distinct = sorted({value.strip() for value in values})
    if len(distinct) > 1:
        shown = ", ".join(repr(value[:32]) for value in distinct[:4])
        raise BadRequest(f"conflicting Content-Length headers ({shown}): refusing the request")
    return distinct[0]


def read_body(rfile: BinaryIO, headers: Message) -> bytes:
    """Exactly ``Content-Length`` bytes; a short body is a BadRequest, a stalled one times out.

    The connection's request deadline (``ServingLimits.read_timeout_s``, whole
    header and body) raises ``TimeoutError`` out of here; the handler answers 408.
    """
    text = content_length_text(headers)
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_CONTENT_LENGTH_DIGITS:
        raise BadRequest(f"Content-Length {text[:32]!r} is not a byte count")
    length = int(text)
    if length > MAX_BODY_BYTES:
        raise BadRequest(
            f"Content-Length {length} is more than {MAX_BODY_BYTES} bytes",
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
        )
    data = rfile.read(length)
    if len(data) < length:
        raise BadRequest(f"body has {len(data)} bytes, Content-Length says {length}")
    return data


def _depth(value: Any) -> int:
    """Nesting depth of decoded JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def parse_json_body(data: bytes) -> dict[str, Any]:
    """The body as a JSON object; invalid, non-object or too deeply nested JSON is a BadRequest."""
    try:
        body = json.loads(data or b"null")
    except RecursionError:
        raise BadRequest(f"body JSON is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise BadRequest(f"body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"body must be a JSON object, got {type(body).__name__}")
    if _depth(body) > MAX_JSON_DEPTH:
        raise BadRequest(f"body JSON is nested more than {MAX_JSON_DEPTH} levels deep")
    return body


def _token_ids(prompt: Any) -> tuple[int, ...]:
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest(
            f"prompt must be a non-empty list of token ids (non-negative ints); got "
            f"{type(prompt).__name__} {str(prompt)[:80]!r}"
        )
    for index, token in enumerate(prompt):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise BadRequest(
                f"prompt[{index}]={token!r}: prompt must be a list of token ids (non-negative ints)"
            )
    return tuple(prompt)


# Every body field this server honours, with the only values it can honour.
# Anything else is refused by name: silently ignoring ``n=4`` or ``temperature``
# would answer a request the client did not make.
SUPPORTED_FIELDS = (
    "model", "prompt", "max_tokens", "stream", "stream_options", "return_token_ids",
    "temperature", "n", "best_of", "echo", "logprobs", "return_tokens_as_token_ids",
    "prompt_logprobs",
)
# Fields with exactly one supported value (prefill-only, greedy, one choice).
FIXED_VALUES = {"n": 1, "best_of": 1, "echo": False, "temperature": 0.0,
                "return_token_ids": True}


def strict_int(name: str, value: Any) -> int:
    """A JSON integer: ``1.0`` and ``true`` are not integers (Python's ``1.0 == True == 1``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name}={value!r}; expected a JSON integer")
    return value


def _check_fixed(body: dict[str, Any]) -> None:
    unknown = sorted(set(body) - set(SUPPORTED_FIELDS))
    if unknown:
        raise BadRequest(f"unsupported field(s) {', '.join(unknown)}: this prefill-only server "
                         f"honours only {', '.join(SUPPORTED_FIELDS)}")
    for name, wanted in FIXED_VALUES.items():
        value = body.get(name)
        if value is None:
            continue
        # Types first: JSON true must not pass for 1, nor 0 for false.
        if type(value) is not type(wanted) and not (
                isinstance(wanted, float) and type(value) is int):
            raise BadRequest(f"{name}={value!r}; this server supports only {name}={wanted!r}")
        if value != wanted:
            raise BadRequest(f"{name}={value!r}; this server supports only {name}={wanted!r}")


def parse_completion_request(
    body: dict[str, Any], served_model_name: str
) -> tuple[tuple[int, ...], bool, bool]:
    """Validate a ``/v1/completions`` body; returns (token ids, stream, include_usage)."""
    _check_fixed(body)
    model = body.get("model", served_model_name)
    if model != served_model_name:
        raise BadRequest(f"model={model!r}; this server serves {served_model_name!r}")
    token_ids = _token_ids(body.get("prompt"))
    max_tokens = strict_int("max_tokens", body.get("max_tokens", PREFILL_MAX_TOKENS))
    if max_tokens != PREFILL_MAX_TOKENS:
        raise BadRequest(
            f"max_tokens={max_tokens!r}; this prefill-only server generates exactly "
            f"{PREFILL_MAX_TOKENS} token"
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream={stream!r}; expected a boolean")
    stream_options = body.get("stream_options")
    if stream_options is None:
        stream_options = {}
    if not isinstance(stream_options, dict):
        raise BadRequest(f"stream_options={str(stream_options)[:80]!r}; expected a JSON object")
    unknown_options = sorted(set(stream_options) - {"include_usage"})
    if unknown_options:
        raise BadRequest(f"unsupported stream_options field(s) {', '.join(unknown_options)}: "
                         "only include_usage is honoured")
    include_usage = stream_options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise BadRequest(f"stream_options.include_usage={include_usage!r}; expected a boolean")
    return token_ids, stream, include_usage


def check_prompt(token_ids: tuple[int, ...], limits: ServingLimits, schedulable: int) -> None:
    """Token ids inside the vocabulary, and no longer than the server admits or can schedule."""
    if limits.vocab_size is not None:
        for index, token in enumerate(token_ids):
            if token >= limits.vocab_size:
                raise BadRequest(
                    f"prompt[{index}]={token}: token id outside the vocabulary "
                    f"[0, {limits.vocab_size})"
                )
    longest = min(limits.max_prompt_tokens, schedulable)
    if len(token_ids) > longest:
        why = (
            f"--max-prompt-tokens {limits.max_prompt_tokens}"
            if longest == limits.max_prompt_tokens
            else f"the step budget max_num_batched_tokens in whole KV pages, without chunked "
            f"prefill: {schedulable}"
        )
        raise BadRequest(
            f"prompt has {len(token_ids)} tokens; this server admits at most {longest} ({why})"
        )
