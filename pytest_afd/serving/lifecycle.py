"""Start servers as child processes, wait until healthy, and always stop them.

Every child runs in its own session (process group) so stopping it also stops
the workers it forked; its output goes to a log file in the results directory,
and the tail of that log is quoted in every failure so a person sees *why* a
server did not come up. On Linux a child also gets SIGTERM when the harness
process dies, so a crashed or killed pytest leaves no server behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

DEFAULT_STARTUP_TIMEOUT_S = 600.0
DEFAULT_STOP_TIMEOUT_S = 15.0
HEALTH_POLL_INTERVAL_S = 0.1
HEALTH_REQUEST_TIMEOUT_S = 2.0
LOG_TAIL_LINES = 20
HTTP_OK = 200
LOOPBACK_HOST = "127.0.0.1"
# prctl(2) option that delivers a signal to a child when its parent dies.
_PR_SET_PDEATHSIG = 1


class ServerStartupError(RuntimeError):
    """A server exited or stayed unhealthy during startup; it has been stopped."""


class ServerExitedError(RuntimeError):
    """A server that was healthy is no longer running."""


@dataclass(frozen=True)
class ServerSpec:
    """How to start one server process and how to tell it is ready."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = LOOPBACK_HOST
    # Either the port is known in advance, or the server binds port 0 and
    # writes the port it got into ``port_file``. A process without an HTTP
    # endpoint (a headless vLLM DP worker) sets ``health_path=None``: it is
    # ready once started and is only watched for exiting.
    port: int | None = None
    port_file: Path | None = None
    health_path: str | None = "/health"
    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError(f"server {self.name!r}: empty argv")
        if self.health_path is not None and (self.port is None) == (self.port_file is None):
            raise ValueError(
                f"server {self.name!r}: give exactly one of port={self.port!r} "
                f"and port_file={self.port_file!r}"
            )
        if self.startup_timeout_s <= 0:
            raise ValueError(f"startup_timeout_s={self.startup_timeout_s!r}; expected > 0")


def _die_with_parent() -> None:
    """Runs in the child before exec: ask the kernel for SIGTERM when the parent dies."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _read_port_file(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def _health_ok(host: str, port: int, path: str) -> bool:
    connection = http.client.HTTPConnection(host, port, timeout=HEALTH_REQUEST_TIMEOUT_S)
    try:
        connection.request("GET", path)
        return connection.getresponse().status == HTTP_OK
    except OSError:
        return False
    finally:
        connection.close()


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last lines of a log, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    tail = text.splitlines()[-lines:]
    return "\n".join(tail) if tail else "(log is empty)"


class ManagedServer:
    """One server child process; use as a context manager so it is always stopped."""

    def __init__(self, spec: ServerSpec, log_dir: Path) -> None:
        self.spec = spec
        self.log_path = Path(log_dir) / f"{spec.name}.log"
        self.port: int | None = spec.port
        self._process: subprocess.Popen[bytes] | None = None
        self._returncode: int | None = None
        self._started_at = 0.0

    # -- state ---------------------------------------------------------------
    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError(f"server {self.spec.name!r} was never started")
        return self._process.pid

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"server {self.spec.name!r} has no port yet (not started)")
        return f"http://{self.spec.host}:{self.port}"

    def poll(self) -> int | None:
        """Exit code once the process has exited, else None."""
        if self._process is None:
            return self._returncode
        return self._process.poll()

    def exit_reason(self) -> str | None:
        """None while running; otherwise a sentence for an error message."""
        code = self.poll()
        if code is None:
            return None
        return (
            f"server {self.spec.name!r} (pid {self.pid}) exited with code {code}; "
            f"log {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def check_alive(self) -> None:
        reason = self.exit_reason()
        if reason is not None:
            raise ServerExitedError(reason)

    # -- start / stop --------------------------------------------------------
    def start(self) -> ManagedServer:
        """Start the child and block until its health endpoint answers 200."""
        self.spawn()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def spawn(self) -> None:
        """Start the child without waiting (servers that rendezvous start together)."""
        if self._process is not None:
            raise RuntimeError(f"server {self.spec.name!r} already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.spec.port_file is not None:
            self.spec.port_file.unlink(missing_ok=True)
        env = {**os.environ, **self.spec.env}
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                list(self.spec.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._started_at = time.monotonic()

    def wait_ready(self, sibling_failure: Callable[[], str | None] | None = None) -> None:
        """Block until healthy; raise ServerStartupError on exit, sibling failure or timeout.

        The caller stops the process on failure (``start`` and ``ServerGroup`` do).
        """
        started = self._started_at
        deadline = started + self.spec.startup_timeout_s
        while True:
            code = self.poll()
            if code is not None:
                raise ServerStartupError(
                    f"server {self.spec.name!r} exited with code {code} during startup "
                    f"(after {time.monotonic() - started:.1f} s); log {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            sibling = sibling_failure() if sibling_failure is not None else None
            if sibling is not None:
                raise ServerStartupError(
                    f"server {self.spec.name!r} stopped waiting: a server it starts with failed: {sibling}")
            if self.spec.health_path is None:
                return
            if self.port is None and self.spec.port_file is not None:
                self.port = _read_port_file(self.spec.port_file)
            if self.port is not None and _health_ok(self.spec.host, self.port, self.spec.health_path):
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(HEALTH_POLL_INTERVAL_S)
        where = f"{self.spec.host}:{self.port}" if self.port is not None else "(no port reported)"
        raise ServerStartupError(
            f"server {self.spec.name!r} did not become healthy at {where}{self.spec.health_path} "
            f"within {self.spec.startup_timeout_s:.1f} s; it was stopped. Log {self.log_path}:\n"
            f"{log_tail(self.log_path)}"
        )

    def stop(self) -> int | None:
        """SIGTERM the whole process group, then SIGKILL after ``stop_timeout_s``."""
        process = self._process
        if process is None:
            return self._returncode
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=self.spec.stop_timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        # Workers the server forked share its group; make sure none outlive it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        self._returncode = process.returncode
        return self._returncode

    def __enter__(self) -> ManagedServer:
        if self._process is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class ServerGroup:
    """Several servers started in order and stopped in reverse order, all or none."""

    def __init__(self, specs: Sequence[ServerSpec], log_dir: Path) -> None:
        self.servers = [ManagedServer(spec, log_dir) for spec in specs]

    def start(self) -> ServerGroup:
        """Spawn every server, then wait for each; any failure stops them all."""
        try:
            for server in self.servers:
                server.spawn()
            for server in self.servers:
                server.wait_ready(sibling_failure=self.exit_reason)
        except BaseException:
            self.stop()
            raise
        return self

    def exit_reason(self) -> str | None:
        for server in self.servers:
            reason = server.exit_reason()
            if reason is not None:
                return reason
        return None

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()

    def __enter__(self) -> ServerGroup:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
