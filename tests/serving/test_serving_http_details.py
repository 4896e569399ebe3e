"""HTTP details of the CPU server (issue 23, row 15): Content-Length conflicts, fields the
server cannot honour, strict integers, HTTP/1.1 keep-alive. In-process, loopback only."""

from __future__ import annotations

import http.client
import json

import pytest

from pytest_afd.serving.engine import DEFAULT_BATCH_WINDOW_S
from pytest_afd.serving.requests import ServingLimits
from tests.support.serving_test_helpers import (
    CLIENT_TIMEOUT_S,
    MODEL,
    VOCAB,
    post,
    raw_exchange,
    serving,
)

BODY = json.dumps({"model": MODEL, "prompt": [1, 2, 3]}).encode()


def one_at_a_time(backend):
    """``serving`` for tests that send one request at a time: the engine's own 20 ms batch
    window, not the half second that lets a burst of 8 land in one batch (which every lone
    request here would wait out)."""
    return serving(backend, ServingLimits(vocab_size=VOCAB), batch_window_s=DEFAULT_BATCH_WINDOW_S)


def two_lengths(first: int, second: int) -> bytes:
    """No half-close: a client that shuts its sending side is gone (aborted, as in vLLM)."""
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\nContent-Length: {first}\r\nContent-Length: {second}\r\n"
            "\r\n").encode() + BODY


def test_conflicting_content_lengths_are_refused_and_equal_ones_served(backend):
    with one_at_a_time(backend) as httpd:
        port = httpd.server_address[1]
        conflicting = raw_exchange(port, two_lengths(len(BODY), len(BODY) - 5), half_close=False)
        repeated = raw_exchange(port, two_lengths(len(BODY), len(BODY)), half_close=False)
    assert b" 400 " in conflicting.split(b"\r\n")[0]
    assert b"conflicting Content-Length headers" in conflicting
    assert b" 200 " in repeated.split(b"\r\n")[0]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"n": 4}, "n=4; this server supports only n=1"),
        ({"best_of": 2}, "best_of=2; this server supports only best_of=1"),
        ({"temperature": 0.7}, "temperature=0.7; this server supports only temperature=0.0"),
        ({"echo": True}, "echo=True; this server supports only echo=False"),
        ({"n": True}, "n=True; this server supports only n=1"),
        ({"top_p": 0.5}, "unsupported field(s) top_p"),
        ({"stream_options": {"continuous_usage_stats": True}},
         "unsupported stream_options field(s) continuous_usage_stats"),
        ({"max_tokens": 1.0}, "max_tokens=1.0; expected a JSON integer"),
        ({"max_tokens": True}, "max_tokens=True; expected a JSON integer"),
    ],
)
def test_fields_the_server_cannot_honour_are_refused_by_name(backend, extra, message):
    with one_at_a_time(backend) as httpd:
        status, body = post(httpd.server_address[1], {"prompt": [1, 2, 3], **extra})
    assert status == 400 and message in body["error"]["message"]


def test_the_values_the_server_does_honour_are_accepted(backend):
    """What the harness's own client sends (greedy, one choice, token ids) is served."""
    honoured = {"prompt": [1, 2, 3], "max_tokens": 1, "n": 1, "best_of": 1, "echo": False,
                "temperature": 0, "return_token_ids": True, "stream": False}
    with one_at_a_time(backend) as httpd:
        assert post(httpd.server_address[1], honoured)[0] == 200
        assert post(httpd.server_address[1], {**honoured, "temperature": 0.0})[0] == 200


def test_http11_keep_alive_serves_several_requests_on_one_connection(backend):
    with one_at_a_time(backend) as httpd:
        connection = http.client.HTTPConnection("127.0.0.1", httpd.server_address[1],
                                                timeout=CLIENT_TIMEOUT_S)
        try:
            statuses, sockets = [], []
            for path in ("/health", "/v1/completions", "/v1/completions", "/metrics"):
                if path == "/v1/completions":
                    connection.request("POST", path, body=BODY,
                                       headers={"Content-Type": "application/json"})
                else:
                    connection.request("GET", path)
                response = connection.getresponse()
                response.read()
                statuses.append((response.version, response.status))
                sockets.append(connection.sock)
        finally:
            connection.close()
    assert statuses == [(11, 200)] * 4
    # http.client reopens a connection the server closed: one socket means keep-alive held.
    assert all(sock is sockets[0] for sock in sockets) and sockets[0] is not None


def test_a_stream_closes_its_connection_and_says_so(backend):
    body = json.dumps({"prompt": [1, 2, 3], "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with one_at_a_time(backend) as httpd:
        # No half-close: only the server ending the stream ends this read.
        answer = raw_exchange(httpd.server_address[1], head + body, half_close=False)
    assert b"Connection: close" in answer and answer.endswith(b"data: [DONE]\n\n")
