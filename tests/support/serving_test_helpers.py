"""Shared by the serving tests: an in-process server on loopback around the real CPU backend.

Every wait is bounded by a socket timeout; nothing depends on how fast the host is.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from pytest_afd.backends.base import RunSettings
from pytest_afd.serving.engine import DEFAULT_STALL_TIMEOUT_S, PrefillEngine
from pytest_afd.serving.requests import ServingLimits
from pytest_afd.serving.server import AfdHTTPServer

MODEL = "reduced"
VOCAB = 2048  # the reduced model's vocabulary
SETTINGS = RunSettings(return_logits=False, max_num_seqs=8)
# Generous: a loaded 2-core host prefills slowly; a hang is what these bound.
CLIENT_TIMEOUT_S = 300.0
SERVER_STARTUP_S = 180.0  # a child server imports torch and builds its model first
# Long enough that a burst of 8 lands in one batch on a loaded host.
BURST_WINDOW_S = 0.5
# How often the serving loop checks for shutdown (socketserver's default, 0.5 s, is what
# leaving ``serving`` would otherwise wait; requests are answered as they arrive either way).
SERVE_POLL_INTERVAL_S = 0.05


class RecordingBackend:
    """Passes every call to the real backend and records the batches the engine formed."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.capabilities = inner.capabilities
        self.batches: list[list[str]] = []

    def run(self, prompts, settings):
        self.batches.append([p.request_id.split("#")[0] for p in prompts])
        return self.inner.run(prompts, settings)

    def reset_prefix_cache(self):
        self.inner.reset_prefix_cache()

    def describe(self):
        return self.inner.describe()

    def close(self):
        pass  # the module fixture closes the real backend


@contextmanager
def serving(backend, limits: ServingLimits, settings: RunSettings = SETTINGS,
            batch_window_s: float = BURST_WINDOW_S,
            stall_timeout_s: float = DEFAULT_STALL_TIMEOUT_S) -> Iterator[AfdHTTPServer]:
    engine = PrefillEngine(backend, settings, batch_window_s, limits.max_batch_tokens,
                           stall_timeout_s)
    engine.start()
    httpd = AfdHTTPServer(("127.0.0.1", 0), engine, MODEL, limits)
    thread = threading.Thread(target=httpd.serve_forever, args=(SERVE_POLL_INTERVAL_S,),
                              daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        engine.stop()
        thread.join(timeout=CLIENT_TIMEOUT_S)


def post(port: int, body, request_id: str | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    headers = {"Content-Type": "application/json", **({"X-Request-Id": request_id} if request_id else {})}
    try:
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        connection.request("POST", "/v1/completions", body=payload, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


def burst(port: int, bodies: Sequence[dict]) -> list[tuple[int, dict]]:
    """All bodies POSTed at once (a barrier releases every client together)."""
    barrier = threading.Barrier(len(bodies))

    def one(index: int) -> tuple[int, dict]:
        barrier.wait(timeout=CLIENT_TIMEOUT_S)
        return post(port, bodies[index], request_id=f"client-{index}")

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(one, range(len(bodies))))


def prompt(index: int, length: int = 8) -> list[int]:
    return [(7 * index + j) % 1000 + 1 for j in range(length)]


def raw_exchange(port: int, data: bytes, *, half_close: bool) -> bytes:
    """Send ``data`` on a raw connection and read the whole answer (bounded by a timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT_S) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def request_bytes(body: bytes, content_length: int) -> bytes:
    return (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {content_length}\r\n\r\n").encode() + body




def start_server_process(tmp_path, arguments: Sequence[str],
                         preexec_fn=None) -> tuple[subprocess.Popen, int]:
    """``python -m pytest_afd.serving.server`` as a child (the signal handlers and process
    limits are part of what such tests check), on loopback port 0, one thread for the
    math; its output goes to ``tmp_path/server.log``. Returns the process and its port."""
    port_file = tmp_path / "port"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest_afd.cli", "serve", "--port", "0", "--port-file",
         str(port_file), "--results-dir", str(tmp_path),
         "--settings-json", json.dumps({"return_logits": False}), *arguments],
        env=env, stdout=open(tmp_path / "server.log", "wb"), stderr=subprocess.STDOUT,
        preexec_fn=preexec_fn)
    deadline = time.monotonic() + SERVER_STARTUP_S
    while not port_file.exists():
        assert process.poll() is None, (tmp_path / "server.log").read_text()
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)
    return process, int(port_file.read_text())
