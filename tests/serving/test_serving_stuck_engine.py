"""A frozen AFD rank behind the HTTP server (issue 23, row 9).

``kill -STOP`` of the FFN rank while the server runs with ``afd_processes``:
``/health`` must turn 503 while the engine makes no progress, the request must
fail within the configured peer timeout (not the runtime's 120 s default), and
the 500 must carry one line for the client: no traceback, no file paths (those
go to the server log). In-process server on loopback; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import threading
import time

import pytest

from pytest_afd.backends import create_backend
from pytest_afd.core.backend import RunSettings
from pytest_afd.serving.requests import ServingLimits
from tests.support.serving_test_helpers import CLIENT_TIMEOUT_S, post, prompt, serving

SMALL_MODEL = "reduced:num_hidden_layers=4,first_k_dense_replace=1"
PEER_TIMEOUT_S = 3.0
STALL_TIMEOUT_S = 1.0
# Generous next to PEER_TIMEOUT_S, well short of the runtime's 120 s default.
FAILURE_BOUND_S = 60.0
SETTINGS = RunSettings(afd_processes=True, return_logits=False, block_size=16)


def health(port: int) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    try:
        connection.request("GET", "/health")
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.fixture
def afd_backend(tmp_path):
    backend = create_backend("cpu", topology=None, model_name=SMALL_MODEL, seed=0,
                             results_dir=tmp_path, peer_timeout_s=PEER_TIMEOUT_S)
    yield backend
    backend.close()


def test_a_frozen_rank_turns_health_503_and_fails_without_a_traceback(afd_backend, capfd):
    limits = ServingLimits()
    with serving(afd_backend, limits, settings=SETTINGS, batch_window_s=0.02,
                 stall_timeout_s=STALL_TIMEOUT_S) as httpd:
        port = httpd.server_address[1]
        assert post(port, {"prompt": prompt(0, 24)})[0] == 200  # starts the ranks
        assert health(port)[0] == 200
        runtime = afd_backend._afd_runtime  # the rank processes this test freezes
        assert runtime.peer_timeout_s == PEER_TIMEOUT_S
        frozen = runtime.pids["FFN rank 0"]
        os.kill(frozen, signal.SIGSTOP)
        answer: dict[str, object] = {}

        def ask() -> None:
            started = time.monotonic()
            answer["reply"] = post(port, {"prompt": prompt(1, 24)}, request_id="frozen")
            answer["seconds"] = time.monotonic() - started

        try:
            asker = threading.Thread(target=ask)
            asker.start()
            stuck: tuple[int, bytes] | None = None
            deadline = time.monotonic() + FAILURE_BOUND_S
            while asker.is_alive() and time.monotonic() < deadline:
                status, body = health(port)
                if status == 503:
                    stuck = (status, body)
                    break
                time.sleep(0.1)
            asker.join(FAILURE_BOUND_S)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the failure already killed it
                os.kill(frozen, signal.SIGKILL)  # also ends a stopped process
        assert stuck is not None, "/health never reported the stalled engine"
        assert b"without finishing (stall bound 1 s)" in stuck[1]
        status, body = answer["reply"]
        assert answer["seconds"] < FAILURE_BOUND_S
        assert health(port)[0] == 200  # the batch failed: the engine is making progress again
    message = body["error"]["message"]
    assert status == 500 and message.startswith("prefill failed:"), message
    assert "rank" in message and "details in the server log" in message
    assert "Traceback" not in message and 'File "' not in message and ".py" not in message
    assert "\n" not in message
    log = capfd.readouterr().err
    assert "frozen" in log and "Traceback" in log  # the whole text went to the log
