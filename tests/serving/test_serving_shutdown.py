"""SIGTERM while a request runs and others are queued (issue 23, row 10).

The running request is answered 200, each queued one 503 (with Retry-After),
and the server exits 0. The server is a real child process (the signal handler
is part of what is tested) on loopback; every wait is bounded.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import threading
import time

from pytest_afd.serving.prometheus import parse_prometheus, sum_metric
from tests.support.serving_test_helpers import CLIENT_TIMEOUT_S, prompt, start_server_process

# Long enough that three more requests queue behind it; the batch budget keeps them out of
# its batch (a 4,096-token prompt held the engine ~15 s in the reproducer).
LONG_TOKENS = 1536
QUEUED = 3


def start_server(tmp_path) -> tuple[subprocess.Popen, int]:
    return start_server_process(tmp_path, ["--max-batch-tokens", str(LONG_TOKENS)])


def gauge(port: int, name: str) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    return sum_metric(parse_prometheus(text), (name,))


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_sigterm_answers_the_running_request_and_503s_the_queued_ones(tmp_path):
    process, port = start_server(tmp_path)
    answers: dict[str, tuple[int, dict, str | None]] = {}

    def ask(name: str, tokens: list[int]) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
        try:
            connection.request("POST", "/v1/completions", body=json.dumps({"prompt": tokens}),
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            answers[name] = (response.status, json.loads(response.read()),
                             response.getheader("Retry-After"))
        except OSError as error:
            answers[name] = (0, {"error": repr(error)}, None)
        finally:
            connection.close()

    try:
        threads = [threading.Thread(target=ask, args=("long", prompt(0, LONG_TOKENS)))]
        threads[0].start()
        wait_for(lambda: gauge(port, "vllm:num_requests_running") == 1, "the long prefill")
        for index in range(QUEUED):
            threads.append(threading.Thread(target=ask, args=(f"queued-{index}", prompt(index))))
            threads[-1].start()
        wait_for(lambda: gauge(port, "vllm:num_requests_waiting") == QUEUED, "3 queued")
        assert gauge(port, "vllm:num_requests_running") == 1  # still running: SIGTERM now
        process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(CLIENT_TIMEOUT_S)
        returncode = process.wait(CLIENT_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    log = (tmp_path / "server.log").read_text()
    assert answers["long"][0] == 200, (answers["long"], log)
    for index in range(QUEUED):
        status, body, retry_after = answers[f"queued-{index}"]
        assert status == 503, (status, body, log)
        assert "shutting down" in body["error"]["message"] and retry_after is not None
    assert returncode == 0, log
