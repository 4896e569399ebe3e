"""Streaming OpenAI-compatible ``/v1/completions`` client for prefill benchmarks.

Each prompt is sent as token ids with ``max_tokens=1`` (prefill isolation) and
``stream=True``; TTFT is the time from sending the request to the first
streamed chunk that carries a choice. Arrivals are all at once, Poisson, or
replayed from a trace of offsets. Around a run the client scrapes ``/metrics``
so the realized prefix-cache hit ratio comes from the server's own counters.

Only the standard library is used (``http.client``, threads) so the harness adds
no HTTP dependency; one thread per in-flight request is plenty for prefill
benchmarks whose concurrency is bounded by ``max_num_seqs``.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from pytest_afd.core.backend import PromptRequest
from pytest_afd.serving.logprobs import LogprobsFormatError, parse_first_top_logprobs
from pytest_afd.serving.prometheus import PrefixCacheDelta, ServerCounters, prefix_cache_delta
from pytest_afd.serving.requests import INSTRUMENT_HEADER, INSTRUMENT_ON

PREFILL_MAX_TOKENS = 1
DEFAULT_REQUEST_TIMEOUT_S = 600.0
METRICS_TIMEOUT_S = 10.0
ARRIVAL_POLL_S = 0.05
HTTP_OK = 200
SSE_DATA_PREFIX = "data:"
SSE_DONE = "[DONE]"
TTFT_PERCENTILES = (50, 90, 95, 99)
ARRIVAL_KINDS = ("all_at_once", "poisson", "trace")


class ClientError(RuntimeError):
    """The server could not be reached or answered outside the API contract."""


@dataclass(frozen=True)
class Arrival:
    """When each request is sent, as offsets in seconds from the start of the run."""

    kind: str = "all_at_once"
    rate: float | None = None  # requests/s, Poisson only
    seed: int = 0
    offsets: tuple[float, ...] = ()  # trace only
    label: str = ""  # where a trace came from (e.g. a workload's arrival process)

    def __post_init__(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ValueError(f"arrival kind={self.kind!r}; expected one of {ARRIVAL_KINDS}")
        if self.kind == "poisson" and (self.rate is None or not self.rate > 0 or math.isinf(self.rate)):
            raise ValueError(f"poisson arrival needs a finite rate > 0 requests/s, got {self.rate!r}")
        if self.kind == "trace":
            if any(offset < 0 for offset in self.offsets):
                raise ValueError(f"trace offsets must be >= 0 s, got {self.offsets!r}")
            if list(self.offsets) != sorted(self.offsets):
                raise ValueError(f"trace offsets must be non-decreasing, got {self.offsets!r}")

    @classmethod
    def poisson(cls, rate: float, seed: int = 0) -> Arrival:
        return cls(kind="poisson", rate=rate, seed=seed)

    @classmethod
    def trace(cls, offsets: Sequence[float]) -> Arrival:
        return cls(kind="trace", offsets=tuple(float(offset) for offset in offsets))

    @classmethod
    def from_workload(cls, workload: Any) -> Arrival:
        """Replay a :class:`pytest_afd.workloads.Workload`'s own arrival times."""
        process = workload.spec.arrival
        if process == "all_at_once":
            return cls()
        return cls(kind="trace", offsets=tuple(float(t) for t in workload.arrival_times_s),
                   seed=workload.spec.seed, label=f"workload {workload.name}: {process}")

    def schedule(self, num_requests: int) -> list[float]:
        """Send offsets for ``num_requests`` requests (deterministic for a seed)."""
        if self.kind == "all_at_once":
            return [0.0] * num_requests
        if self.kind == "poisson":
            if num_requests == 0:
                return []
            gaps = np.random.default_rng(self.seed).exponential(1.0 / self.rate, num_requests)
            return [float(value) for value in np.cumsum(gaps) - gaps[0]]
        if len(self.offsets) != num_requests:
            raise ValueError(f"trace has {len(self.offsets)} offsets for {num_requests} requests")
        return list(self.offsets)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "rate": self.rate, "seed": self.seed,
                "offsets": list(self.offsets), "label": self.label}


@dataclass
class RequestResult:
    request_id: str
    num_input_tokens: int
    success: bool = False
    # Tokens the server reported as prefix-cache hits (usage.prompt_tokens_details).
    num_cached_tokens: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    send_offset_s: float | None = None
    token_ids: tuple[int, ...] = ()
    # Token id -> logprob of the generated token's top-k, when the request asked for logprobs.
    top_logprobs: dict[int, float] | None = None
    error: str | None = None


@dataclass
class ClientRun:
    results: list[RequestResult]
    duration_s: float
    arrival: Arrival
    prefix_cache: PrefixCacheDelta | None = None
    metrics_error: str | None = None
    aborted: str | None = None  # why unsent requests were failed (server gone)

    @property
    def succeeded(self) -> list[RequestResult]:
        return [result for result in self.results if result.success]

    @property
    def failed(self) -> list[RequestResult]:
        return [result for result in self.results if not result.success]

    def summary(self) -> dict[str, Any]:
        """End-to-end serving metrics of the run (RFC §3)."""
        ok = self.succeeded
        ttfts = [result.ttft_s for result in ok if result.ttft_s is not None]
        input_tokens = sum(result.num_input_tokens for result in ok)
        duration = self.duration_s if self.duration_s > 0 else math.nan
        summary: dict[str, Any] = {
            "completed": len(ok),
            "failed": len(self.failed),
            "duration_s": self.duration_s,
            "total_input_tokens": input_tokens,
            "input_tokens_per_s": input_tokens / duration,
            "requests_per_s": len(ok) / duration,
            "ttft_s": {f"p{q}": (float(np.percentile(ttfts, q)) if ttfts else None)
                       for q in TTFT_PERCENTILES},
            "arrival": self.arrival.to_json(),
        }
        if self.prefix_cache is not None:
            summary["prefix_cache"] = {"queried_tokens": self.prefix_cache.queried_tokens,
                                       "hit_tokens": self.prefix_cache.hit_tokens,
                                       "hit_ratio": self.prefix_cache.hit_ratio}
        return summary


def _parse_sse_payload(line: bytes) -> str | None:
    text = line.decode("utf-8", errors="replace").strip()
    if not text.startswith(SSE_DATA_PREFIX):
        return None
    return text[len(SSE_DATA_PREFIX):].strip()


def _error_message(status: int, body: bytes) -> str:
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", errors="replace")[:500]
    return f"HTTP {status}: {message}"


class CompletionsClient:
    """Talks to one OpenAI-compatible server (vLLM, vLLM-Ascend, or the CPU server)."""

    def __init__(self, base_url: str, model: str, *,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 api_key: str | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"base_url={base_url!r}; expected http://HOST:PORT")
        self.base_url = base_url
        self.host = parts.hostname
        self.port = parts.port
        self.model = model
        self.request_timeout_s = request_timeout_s
        # vLLM's --api-key: sent as a bearer token (vLLM checks it on /v1/*).
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    # -- single request ------------------------------------------------------
    def complete(self, prompt: PromptRequest, *, logprobs: int | None = None,
                 instrument: bool = False) -> RequestResult:
        """Stream one prefill; never raises for server-side failures (they are recorded).

        ``logprobs`` asks for the generated token's top-k logprobs (vLLM's
        ``logprobs`` field, tokens spelled as ids); a reply without them is an error.
        """
        return self.send(prompt, logprobs=logprobs, instrument=instrument)()

    def send(self, prompt: PromptRequest, *, logprobs: int | None = None,
             instrument: bool = False) -> Callable[[], RequestResult]:
        """Connect and send one prefill request now; the returned call reads its answer.

        ``run`` sends in prompt order from one thread, so the server accepts the
        connections in that order (its batches run in accept order) and only the
        waits are concurrent.
        """
        result = RequestResult(prompt.request_id, prompt.num_prompt_tokens)
        request: dict[str, Any] = {
            "model": self.model, "prompt": list(prompt.prompt_token_ids),
            "max_tokens": PREFILL_MAX_TOKENS, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True,
            "temperature": 0.0,
        }
        if logprobs is not None:
            request.update(logprobs=logprobs, return_tokens_as_token_ids=True)
        body = json.dumps(request)
        connection = self._connection(self.request_timeout_s)
        started = time.perf_counter()
        try:
            connection.request("POST", "/v1/completions", body=body, headers={
                "Content-Type": "application/json", "X-Request-Id": prompt.request_id,
                **({INSTRUMENT_HEADER: INSTRUMENT_ON} if instrument else {}), **self._auth})
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            result.error = f"{type(error).__name__}: {error}"
            result.latency_s = time.perf_counter() - started
            return lambda: result
        return lambda: self._answer(connection, started, result, logprobs)

    def _answer(self, connection: http.client.HTTPConnection, started: float,
                result: RequestResult, logprobs: int | None) -> RequestResult:
        try:
            response = connection.getresponse()
            if response.status != HTTP_OK:
                result.error = _error_message(response.status, response.read())
                return result
            self._read_stream(response, result, started)
            if logprobs is not None and result.success and result.top_logprobs is None:
                result.success = False
                result.error = (f"asked for logprobs={logprobs} but the stream carried no "
                                "choices[0].logprobs")
        except (OSError, http.client.HTTPException) as error:
            result.error = f"{type(error).__name__}: {error}"
        except (ValueError, KeyError, TypeError, LogprobsFormatError) as error:  # outside the API contract
            result.success = False
            result.error = f"malformed stream chunk: {type(error).__name__}: {error}"
        finally:
            connection.close()
            result.latency_s = time.perf_counter() - started
        return result

    @staticmethod
    def _read_stream(response: http.client.HTTPResponse, result: RequestResult, started: float) -> None:
        token_ids: list[int] = []
        done = False
        for line in response:
            payload = _parse_sse_payload(line)
            if payload is None:
                continue
            if payload == SSE_DONE:
                done = True
                break
            chunk = json.loads(payload)
            if chunk.get("choices"):
                if result.ttft_s is None:
                    result.ttft_s = time.perf_counter() - started
                choice = chunk["choices"][0]
                token_ids.extend(choice.get("token_ids") or ())
                if result.top_logprobs is None:
                    result.top_logprobs = parse_first_top_logprobs(choice.get("logprobs"))
            usage = chunk.get("usage")
            if usage:
                result.num_input_tokens = usage["prompt_tokens"]
                details = usage.get("prompt_tokens_details") or {}
                result.num_cached_tokens = details.get("cached_tokens")
        result.token_ids = tuple(token_ids)
        if not done:
            result.error = "stream ended before [DONE] (server closed the connection)"
        elif result.ttft_s is None:
            result.error = "stream carried no completion chunk"
        else:
            result.success = True

    # -- server endpoints ----------------------------------------------------
    def _request(self, method: str, path: str) -> bytes:
        """One short control-plane request; any transport error or non-200 is a ClientError."""
        connection = self._connection(METRICS_TIMEOUT_S)
        try:
            connection.request(method, path, headers=self._auth)
            response = connection.getresponse()
            body = response.read()
        except (OSError, http.client.HTTPException) as error:
            raise ClientError(
                f"{method} {self.base_url}{path} failed: {type(error).__name__}: {error}"
            ) from error
        finally:
            connection.close()
        if response.status != HTTP_OK:
            raise ClientError(
                f"{method} {self.base_url}{path}: {_error_message(response.status, body)}"
            )
        return body

    def get_text(self, path: str) -> str:
        return self._request("GET", path).decode("utf-8", errors="replace")

    def scrape_counters(self) -> ServerCounters:
        return ServerCounters.from_text(self.get_text("/metrics"))

    def get_json(self, path: str) -> Any:
        return json.loads(self.get_text(path))

    def reset_prefix_cache(self) -> None:
        self._request("POST", "/reset_prefix_cache")

    # -- a benchmark run -----------------------------------------------------
    def run(self, prompts: Sequence[PromptRequest], arrival: Arrival = Arrival(), *,
            read_metrics: bool = True,
            server_gone: Callable[[], str | None] | None = None,
            logprobs: int | None = None, instrument: bool = False) -> ClientRun:
        """Send every prompt on the arrival schedule and wait for all of them.

        ``instrument`` marks each request of the harness's instrumented run
        (``INSTRUMENT_HEADER``; vLLM ignores the header, the harness's own CPU server
        profiles the batches holding them). ``server_gone`` (e.g.
        ``ManagedServer.exit_reason``) is polled while
        waiting to send; once it reports a reason, unsent requests fail at once
        with that reason instead of each waiting for a connection error.
        """
        offsets = arrival.schedule(len(prompts))
        before, metrics_error = self._try_scrape(read_metrics)
        results = [RequestResult(prompt.request_id, prompt.num_prompt_tokens) for prompt in prompts]
        threads: list[threading.Thread] = []
        aborted: str | None = None
        started = time.perf_counter()
        for index, (prompt, offset) in enumerate(zip(prompts, offsets, strict=True)):
            aborted = aborted or self._wait_until(started + offset, server_gone)
            if aborted is not None:
                results[index].error = f"not sent: {aborted}"
                continue
            results[index].send_offset_s = time.perf_counter() - started

            answer = self.send(prompt, logprobs=logprobs, instrument=instrument)  # in order, from this thread

            def send(slot: int = index, answer: Callable[[], RequestResult] = answer) -> None:
                sent_at = results[slot].send_offset_s
                results[slot] = answer()
                results[slot].send_offset_s = sent_at

            thread = threading.Thread(target=send, name=f"request-{prompt.request_id}", daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
        duration = time.perf_counter() - started
        prefix_cache = None
        if before is not None:
            after, metrics_error = self._try_scrape(read_metrics)
            if after is not None:
                prefix_cache = prefix_cache_delta(before, after)
        return ClientRun(results=results, duration_s=duration, arrival=arrival,
                         prefix_cache=prefix_cache, metrics_error=metrics_error, aborted=aborted)

    def _try_scrape(self, read_metrics: bool) -> tuple[ServerCounters | None, str | None]:
        if not read_metrics:
            return None, None
        try:
            return self.scrape_counters(), None
        except (ClientError, ValueError) as error:
            return None, str(error)

    @staticmethod
    def _wait_until(deadline: float, server_gone: Callable[[], str | None] | None) -> str | None:
        while True:
            reason = server_gone() if server_gone is not None else None
            if reason is not None:
                return reason
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return None
            time.sleep(min(remaining, ARRIVAL_POLL_S))

