"""Slow clients and descriptor exhaustion (issue 23, row 2).

A client that sends its header one byte at a time never trips a per-read
timeout; the server must cut it at the request deadline. Under a lowered
RLIMIT_NOFILE (a child server process, so this test's own limit is untouched)
more slow clients than descriptors must not lock a good client out, and a cap
set above the descriptor budget must back off on EMFILE instead of spinning.
Loopback only; every loop is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import select
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from pytest_afd.serving.prometheus import parse_prometheus, sum_metric
from pytest_afd.serving.requests import ServingLimits
from tests.support.serving_test_helpers import (
    CLIENT_TIMEOUT_S,
    VOCAB,
    serving,
    start_server_process,
)

# The request deadline the servers here get, and the trickle's pace: a byte every quarter
# deadline, so no single read ever waits long. The EMFILE case needs the server to
# accept past its descriptor budget before the first slow clients are cut: the clients
# connect while the server is stopped (SIGSTOP), so all of them wait in the listen
# backlog and the server accepts them in one burst, not at the pace a loaded host lets
# this test connect (twice, at load 8-9, the connects outlasted the deadline and accept
# never ran out of descriptors).
READ_TIMEOUT_S = 2.0
TRICKLE_INTERVAL_S = READ_TIMEOUT_S / 4
# Slow clients trickle this long at most: far past the deadline, and past the good
# client's timeout, so without a request deadline the good client is never served.
TRICKLE_LIMIT_S = 45.0
GOOD_CLIENT_TIMEOUT_S = 30.0
# The slow clients are cut one server-full per deadline: a limit whose budget (less the
# server's own descriptors and headroom) holds most of them needs two deadlines, not three.
FD_LIMIT = 256
SLOW_CLIENTS = 270  # more than the child server has descriptors
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Pad: "
GOOD_BODY = json.dumps({"prompt": [1, 2, 3]}).encode()


def open_slow_clients(port: int, count: int) -> list[socket.socket]:
    clients = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT_S)
        sock.sendall(HEAD)
        sock.setblocking(False)
        clients.append(sock)
    return clients


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends before it closes (a 408's header and body may arrive in
    separate segments, so one recv is not the whole answer); bounded by the client timeout."""
    sock.settimeout(CLIENT_TIMEOUT_S)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except OSError:
        pass  # a reset after the answer: what arrived is the answer
    return received


def trickle_until_cut(clients: list[socket.socket], limit_s: float) -> tuple[int, list[bytes]]:
    """One header byte per client per interval until the server has cut every client or
    ``limit_s`` passed; returns (clients cut, what the server sent the cut ones)."""
    live = {sock.fileno(): sock for sock in clients}
    answers: list[bytes] = []
    deadline = time.monotonic() + limit_s
    while live and time.monotonic() < deadline:
        for fileno, sock in list(live.items()):
            try:
                sock.send(b"a")
            except BlockingIOError:
                pass
            except OSError:  # the server closed: its answer may already be waiting
                answers.append(read_until_closed(live.pop(fileno)))
                continue
        poller = select.poll()
        for fileno in live:
            poller.register(fileno, select.POLLIN | select.POLLERR | select.POLLHUP)
        for fileno, _event in poller.poll(0):
            answers.append(read_until_closed(live.pop(fileno)))
        time.sleep(TRICKLE_INTERVAL_S)
    for sock in clients:
        sock.close()
    return len(clients) - len(live), answers


def test_a_header_sent_a_byte_at_a_time_is_cut_at_the_deadline(backend):
    with serving(backend, ServingLimits(vocab_size=VOCAB, read_timeout_s=READ_TIMEOUT_S)) as httpd:
        port = httpd.server_address[1]
        started = time.monotonic()
        cut, answers = trickle_until_cut(open_slow_clients(port, 1), TRICKLE_LIMIT_S)
        elapsed_s = time.monotonic() - started
        assert httpd.open_connections <= 1  # the cut connection is closed (or closing)
    assert cut == 1 and elapsed_s < TRICKLE_LIMIT_S
    assert b" 408 " in answers[0].split(b"\r\n")[0]
    assert f"request header not received within {READ_TIMEOUT_S} s".encode() in answers[0]


def lowered_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def start_server(tmp_path, extra: list[str]) -> tuple[subprocess.Popen, int]:
    return start_server_process(tmp_path, ["--read-timeout-s", str(READ_TIMEOUT_S), *extra],
                                preexec_fn=lowered_fd_limit)


class GoodClient:
    """One well-behaved request, sent once the slow clients hold the server."""

    def __init__(self, port: int) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", port,
                                                     timeout=GOOD_CLIENT_TIMEOUT_S)
        self.connection.request("POST", "/v1/completions", body=GOOD_BODY,
                                headers={"Content-Type": "application/json"})
        self.sent_at = time.monotonic()

    def answer(self) -> tuple[int | str, float]:
        try:
            response = self.connection.getresponse()
            response.read()
            return response.status, time.monotonic() - self.sent_at
        except OSError as error:
            return repr(error), time.monotonic() - self.sent_at
        finally:
            self.connection.close()


@contextlib.contextmanager
def server_stopped(process: subprocess.Popen) -> Iterator[None]:
    """The server process stopped (SIGSTOP) for the block and continued after it, even
    on an error: the kernel still completes connections into its listen backlog."""
    os.kill(process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)


def metrics(port: int) -> list:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CLIENT_TIMEOUT_S)
    try:
        connection.request("GET", "/metrics")
        return parse_prometheus(connection.getresponse().read().decode())
    finally:
        connection.close()


@pytest.mark.parametrize("cap", [None, 400], ids=["default-cap", "cap-above-fd-limit"])
def test_more_slow_clients_than_descriptors_do_not_lock_out_a_good_client(tmp_path, cap):
    extra = [] if cap is None else ["--max-connections", str(cap)]
    process, port = start_server(tmp_path, extra)
    try:
        with server_stopped(process):  # every client waits in the backlog (READ_TIMEOUT_S)
            clients = open_slow_clients(port, SLOW_CLIENTS)
            good = GoodClient(port)  # queued in the listen backlog behind the slow clients
        cut, _ = trickle_until_cut(clients, TRICKLE_LIMIT_S)
        status, waited_s = good.answer()
        samples = metrics(port)
    finally:
        process.terminate()
        process.wait(CLIENT_TIMEOUT_S)
    log = (tmp_path / "server.log").read_text()
    print(f"good client: {status} after {waited_s:.1f} s; slow clients cut: {cut}")
    assert status == 200 and waited_s < GOOD_CLIENT_TIMEOUT_S, (status, waited_s, log)
    assert cut == SLOW_CLIENTS, log  # every slow client was cut before the trickle ended
    emfile = sum_metric(samples, ("afd:accept_errors_total",),
                        lambda sample: dict(sample.labels)["errno"] == "EMFILE")
    max_connections = sum_metric(samples, ("afd:max_connections",))
    if cap is None:
        # The default cap fits the lowered limit: accept never runs out of descriptors.
        assert max_connections < FD_LIMIT and emfile == 0, log
    else:
        # Past the budget accept failed with EMFILE and backed off (>= 50 ms each time):
        # a busy retry loop fails thousands of times a second.
        assert max_connections == cap and "accept will back off on EMFILE" in log
        print(f"accept EMFILE errors (each backed off): {emfile:.0f}")
        assert 1 <= emfile <= TRICKLE_LIMIT_S / 0.05, (emfile, log)
