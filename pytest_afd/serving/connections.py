"""Connections of the CPU HTTP server: a deadline per request, a cap, back-off on EMFILE.

A socket timeout bounds one read, not a request: a client that sends one header
byte a second never trips it and holds its thread and file descriptor forever.
So every request (the wait for it on a kept-alive connection, its header and its
body) must arrive within one deadline, ``read_timeout_s``. At most
``max_connections`` connections are open at once; past that the listener waits
for one to close (connections queue in the kernel backlog) instead of running
out of file descriptors. If ``accept`` still fails for want of descriptors
(EMFILE), the listener backs off instead of retrying in a busy loop.
See ``docs/serving.md`` ("Connections").
"""

from __future__ import annotations

import errno
import io
import os
import resource
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any

# Descriptors kept free for everything that is not a client connection (the
# backend's files and logs, the AFD runtime's pipes, the listening socket).
FD_HEADROOM = 64
DEFAULT_MAX_CONNECTIONS = 256
# How long the listener waits for a free slot before it re-checks for shutdown.
SLOT_WAIT_S = 0.5
ACCEPT_BACKOFF_MIN_S = 0.05
ACCEPT_BACKOFF_MAX_S = 1.0
# accept() errors that mean "out of descriptors or memory", not "this client".
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# How long a response write may block on a client that does not read.
WRITE_TIMEOUT_S = 30.0


class DeadlineReader(io.RawIOBase):
    """A socket reader whose reads all end by one deadline (``TimeoutError`` past it).

    ``start`` arms the deadline for the next request; ``clear`` lifts it once the
    request is read (the engine's queue and prefill are not the client's to bound).
    """

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self._deadline: float | None = None
        self.expired = False
        self.received = 0

    def start(self, seconds: float) -> None:
        self._deadline = time.monotonic() + seconds
        self.expired = False
        self.received = 0  # bytes of this request so far (0: an idle kept-alive connection)

    def clear(self, timeout_s: float) -> None:
        self._deadline = None
        self._sock.settimeout(timeout_s)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._deadline is not None:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                self.expired = True
                raise TimeoutError("the request deadline passed")
            self._sock.settimeout(remaining)
        try:
            count = self._sock.recv_into(buffer)
        except TimeoutError:
            self.expired = self._deadline is not None
            raise
        self.received += count
        return count


def peer_closed(sock: socket.socket) -> bool:
    """True when the client has closed (or reset) its side; never blocks.

    Readable with nothing to read is end of stream; bytes waiting (a pipelined
    request) mean the client is still there. Uses poll, not select: descriptor
    numbers can pass FD_SETSIZE.
    """
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    try:
        if not poller.poll(0):
            return False
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:  # ECONNRESET, a closed descriptor: the client is gone
        return True


def open_descriptors() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:  # no procfs: assume a small process
        return FD_HEADROOM


def descriptor_budget() -> int:
    """Connections this process can hold: its soft RLIMIT_NOFILE less what is open, less
    :data:`FD_HEADROOM`."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return sys.maxsize
    return soft - open_descriptors() - FD_HEADROOM


def default_max_connections(budget: int) -> int:
    """:data:`DEFAULT_MAX_CONNECTIONS`, lowered to the descriptor budget (at least 1)."""
    return max(1, min(DEFAULT_MAX_CONNECTIONS, budget))


class CappedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a connection cap, EMFILE back-off and a count of
    open connections (shutdown waits for the ones still answering)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, *, max_connections: int,
                 request_queue_size: int) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections={max_connections!r}; expected a positive integer")
        self.max_connections = max_connections
        # listen() takes socketserver's backlog (default 5) when the base class binds.
        self.request_queue_size = request_queue_size
        self._slots = threading.Condition()
        self._open = 0
        self._answering = 0  # requests read and not yet answered
        self.stopping = False  # set on shutdown: no connection is kept alive after it
        self._backoff_s = ACCEPT_BACKOFF_MIN_S
        self.accept_errors: dict[str, int] = {}
        self._accepted = 0
        self._accept_numbers: dict[socket.socket, int] = {}
        super().__init__(address, handler)

    @property
    def open_connections(self) -> int:
        with self._slots:
            return self._open

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept one connection once a slot is free; out of descriptors, back off.

        Raising OSError makes socketserver skip this round (it re-checks for
        shutdown and selects again), so neither wait blocks shutdown for long.
        """
        with self._slots:
            if self._open >= self.max_connections and not self._slots.wait_for(
                    lambda: self._open < self.max_connections, timeout=SLOT_WAIT_S):
                raise OSError(f"at the connection cap ({self.max_connections})")
        try:
            connection, address = super().get_request()
        except OSError as error:
            if error.errno in RESOURCE_ERRNOS:
                name = errno.errorcode[error.errno]
                self.accept_errors[name] = self.accept_errors.get(name, 0) + 1
                time.sleep(self._backoff_s)
                self._backoff_s = min(self._backoff_s * 2, ACCEPT_BACKOFF_MAX_S)
            raise
        self._backoff_s = ACCEPT_BACKOFF_MIN_S
        with self._slots:
            self._open += 1
            self._accepted += 1  # accept() hands connections over in the order they came
            self._accept_numbers[connection] = self._accepted
        return connection, address

    def accept_number(self, connection: socket.socket) -> int | None:
        """The order in which ``connection`` was accepted (1, 2, ...); None if unknown."""
        with self._slots:
            return self._accept_numbers.get(connection)

    def close_request(self, request: Any) -> None:
        try:
            super().close_request(request)
        finally:
            with self._slots:
                self._open -= 1
                self._accept_numbers.pop(request, None)
                self._slots.notify_all()

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Marks one request between its read and its answer (what shutdown waits for)."""
        with self._slots:
            self._answering += 1
        try:
            yield
        finally:
            with self._slots:
                self._answering -= 1
                self._slots.notify_all()

    def wait_answered(self, timeout_s: float) -> int:
        """Wait until every request being answered has its answer; returns how many have not."""
        with self._slots:
            self._slots.wait_for(lambda: self._answering == 0, timeout=timeout_s)
            return self._answering
