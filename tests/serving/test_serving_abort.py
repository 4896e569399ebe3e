"""Abandoned requests (issue 23, row 3): a client that closes right after sending is aborted
before its prefill and counted as aborted, not prefilled and counted as a success.

The engine is held on a first request (a gate) while the abandoned ones queue,
so what is checked is which requests reached the backend, not how fast.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from pytest_afd.core.backend import PromptRequest, RunSettings
from pytest_afd.serving.engine import EngineStopped, PrefillEngine
from pytest_afd.serving.prometheus import ServerCounters, parse_prometheus, sum_metric
from pytest_afd.serving.requests import ServingLimits
from tests.support.serving_test_helpers import (
    CLIENT_TIMEOUT_S,
    MODEL,
    VOCAB,
    RecordingBackend,
    post,
    prompt,
    serving,
)

ABANDONED = 6
ABANDONED_TOKENS = 2048
# Only a hang guard: six 2,048-token prefills took 17.4 s before the fix on an idle host.
QUEUE_WAIT_S = 120.0


class GatedBackend(RecordingBackend):
    """Holds its first batch until released, so requests queue behind it."""

    def __init__(self, inner):
        super().__init__(inner)
        self.entered = threading.Event()
        self.release = threading.Event()

    def run(self, prompts, settings):
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(CLIENT_TIMEOUT_S), "the test never released the gate"
        return super().run(prompts, settings)


def metrics(port: int) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    try:
        connection.request("GET", "/metrics")
        return connection.getresponse().read().decode()
    finally:
        connection.close()


def waiting(port: int) -> float:
    return sum_metric(parse_prometheus(metrics(port)), ("vllm:num_requests_waiting",))


def send_and_close(port: int, body: dict) -> None:
    payload = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT_S) as sock:
        sock.sendall(head + payload)


def test_abandoned_streams_are_aborted_before_their_prefill(backend):
    gated = GatedBackend(backend)
    limits = ServingLimits(vocab_size=VOCAB)
    with serving(gated, limits, batch_window_s=0.02) as httpd:
        port = httpd.server_address[1]
        holder = threading.Thread(target=post, args=(port, {"prompt": prompt(99)}, "holder"))
        holder.start()
        assert gated.entered.wait(CLIENT_TIMEOUT_S)
        for index in range(ABANDONED):
            send_and_close(port, {"model": MODEL, "prompt": prompt(index, ABANDONED_TOKENS),
                                  "stream": True})
        deadline = time.monotonic() + QUEUE_WAIT_S
        while waiting(port) < ABANDONED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting(port) == ABANDONED  # all six read and queued behind the holder
        gated.release.set()
        started = time.monotonic()
        status, body = post(port, {"prompt": [1, 2, 3]}, request_id="short")
        short_wait_s = time.monotonic() - started
        holder.join(CLIENT_TIMEOUT_S)
        counters = ServerCounters.from_text(metrics(port))
    assert status == 200 and body["id"] == "short"
    # No abandoned request reached the backend: only the holder and the short one ran.
    assert [rid for batch in gated.batches for rid in batch] == ["holder", "short"]
    assert counters.request_aborted == ABANDONED
    assert counters.request_success == 2
    assert short_wait_s < QUEUE_WAIT_S


def test_a_stopped_engine_refuses_at_once_and_counts_it_aborted(backend):
    engine = PrefillEngine(backend, RunSettings(return_logits=False))
    engine.start()
    engine.stop()
    future = engine.submit(PromptRequest("late", (1, 2, 3)))
    with pytest.raises(EngineStopped, match="shutting down"):
        future.result(timeout=CLIENT_TIMEOUT_S)
    assert engine.counters().request_aborted == 1
    assert engine.unhealthy_reason() == "the engine thread is not running"
