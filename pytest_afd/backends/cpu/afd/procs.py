"""The parent's side of the AFD runtime: start the ranks, bounded waits, cleanup.

Every Attention and FFN rank is its own OS process (:mod:`.rank_process` is its entry
point). The parent is not a member of the gloo group; it talks to each rank over a
multiprocessing pipe and is the watchdog: every wait it does is bounded, it notices a
dead child through the process sentinel, and any failure tears down every child before
the error reaches the caller, so no orphan outlives a failed run, a test session or a
Ctrl-C. Children also ask the kernel to kill them if their parent (the fork server,
which exits with this process) dies.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from pytest_afd.backends.cpu.afd.protocol import (
    EPHEMERAL_PORT,
    MSG_ERROR,
    MSG_OK,
    MSG_PORT,
    MSG_READY,
    MSG_SHUTDOWN,
    AfdRankFailure,
    AfdRuntimeError,
    RankSpec,
)
from pytest_afd.backends.cpu.afd.rank_process import (
    STANDARD_STREAMS,
    InheritedFd,
    WorkerConfig,
    worker_main,
)

START_METHOD = "forkserver"
"""Ranks fork from a server that imported torch once (spawn imports it in every rank)."""
PRELOADED_MODULES = ("torch", "torch.distributed")
"""Imported by the fork server before any rank; the role factory's module is added."""

WATCHDOG_POLL_S = 0.05
"""How often the parent re-checks child liveness while it waits for replies."""

ROOT_CAUSE_GRACE_S = 0.5
"""After a rank reports an error, how long to look for a dead peer that caused it."""

SHUTDOWN_JOIN_S = 5.0
KILL_JOIN_S = 2.0


class ProcessGroupHandle:
    """The parent's view of the rank processes: command fan-out with a watchdog."""

    def __init__(
        self,
        specs: Sequence[RankSpec],
        *,
        num_threads: int,
        collective_timeout_s: float,
        role_factory: Callable[..., Any],
        role_kwargs_for: Callable[[RankSpec], Mapping[str, Any]],
        cpu_affinity: Sequence[int] | None = None,
        nice: int = 0,
    ) -> None:
        self.specs = tuple(specs)
        self._num_threads = num_threads
        self._collective_timeout_s = collective_timeout_s
        self._role_factory = role_factory
        self._role_kwargs_for = role_kwargs_for
        self._cpu_affinity = None if cpu_affinity is None else tuple(cpu_affinity)
        self._nice = nice
        self._processes: dict[int, multiprocessing.process.BaseProcess] = {}
        self._conns: dict[int, multiprocessing.connection.Connection] = {}
        self.pids: dict[int, int] = {}
        self.rendezvous_port: int | None = None  # the port rank 0's store bound (after start)
        self.closed = False

    def spec(self, global_rank: int) -> RankSpec:
        return self.specs[global_rank]

    def start(self, startup_timeout_s: float, rendezvous_port: int = EPHEMERAL_PORT) -> None:
        """Spawn every rank and wait (bounded) until each has joined gloo and built its role.

        Every rank starts at once (their torch imports overlap); rank 0 binds
        ``rendezvous_port`` (default: any free port), and the others are sent the
        port it really holds only once it reported it.
        """
        deadline = time.monotonic() + startup_timeout_s
        context = multiprocessing.get_context(START_METHOD)
        # Only takes effect if this process has not started its fork server yet.
        context.set_forkserver_preload([*PRELOADED_MODULES, self._role_factory.__module__])
        first, *others = self.specs
        if first.global_rank != 0:
            raise ValueError(f"the first rank spec must be global rank 0, got {first}")
        self._spawn(context, first, rendezvous_port)
        try:
            for spec in others:
                self._spawn(context, spec, None)
        except BaseException:
            self.kill_all()
            raise
        port = self._gather([0], startup_timeout_s, expect=MSG_PORT)[0]
        self.rendezvous_port = port
        try:
            for spec in others:
                self._send(spec.global_rank, (MSG_PORT, port))
        except BaseException:
            self.kill_all()
            raise
        remaining = max(0.0, deadline - time.monotonic())
        replies = self._gather(list(self._conns), remaining, expect=MSG_READY)
        for rank, info in replies.items():
            self.pids[rank] = info["pid"]

    def _spawn(self, context, spec: RankSpec, port: int | None) -> None:
        """Start one rank's process, told the rendezvous port to bind (rank 0) or, with
        None, to wait for the port to join on its pipe."""
        parent_conn, child_conn = context.Pipe()
        config = WorkerConfig(
            spec=spec,
            world_size=len(self.specs),
            master_port=port,
            num_threads=self._num_threads,
            collective_timeout_s=self._collective_timeout_s,
            role_factory=self._role_factory,
            role_kwargs=dict(self._role_kwargs_for(spec)),
            cpu_core=None if self._cpu_affinity is None else self._cpu_affinity[spec.global_rank],
            nice=self._nice,
            environ=dict(os.environ),
            streams=tuple(InheritedFd(fd) for fd in STANDARD_STREAMS),
        )
        # daemon: multiprocessing's own exit hook kills it if close() never runs.
        process = context.Process(
            target=worker_main, args=(child_conn, config), name=spec.name, daemon=True
        )
        process.start()
        child_conn.close()
        self._processes[spec.global_rank] = process
        self._conns[spec.global_rank] = parent_conn
        self.pids[spec.global_rank] = process.pid

    def request(self, messages: Mapping[int, Any], timeout_s: float) -> dict[int, Any]:
        """Send one message to each named rank; return their replies or fail naming the rank."""
        if self.closed:
            raise AfdRuntimeError("the AFD runtime is closed (an earlier failure or close())")
        try:
            # A rank killed between steps is found here, by name, before any send.
            self._raise_if_any_dead()
            for rank, message in messages.items():
                self._send(rank, message)
        except BaseException:
            self.kill_all()
            raise
        return self._gather(list(messages), timeout_s, expect=MSG_OK)

    def _send(self, rank: int, message: Any) -> None:
        """Send one command; a pipe broken by a rank that just died fails naming that rank."""
        try:
            self._conns[rank].send(message)
        except OSError as exc:  # BrokenPipeError, ConnectionResetError
            self._raise_if_any_dead(grace_s=ROOT_CAUSE_GRACE_S)
            name = self.spec(rank).name
            self._fail(f"could not send the command to {name}: {exc!r}", [name])

    def _receive(self, rank: int) -> tuple[str, Any]:
        """Read one reply; a pipe closed or reset by a dying rank fails naming that rank."""
        try:
            return self._conns[rank].recv()
        except (EOFError, OSError) as exc:  # OSError: ConnectionResetError of a killed rank
            self._raise_if_any_dead(grace_s=ROOT_CAUSE_GRACE_S)
            name = self.spec(rank).name
            self._fail(f"{name} closed its pipe without replying ({exc!r})", [name])

    def _gather(self, ranks: list[int], timeout_s: float, *, expect: str) -> dict[int, Any]:
        """Wait for one reply per rank while watching every child; tear down on any failure."""
        deadline = time.monotonic() + timeout_s
        pending = set(ranks)
        replies: dict[int, Any] = {}
        try:
            while pending:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    names = [self.spec(r).name for r in sorted(pending)]
                    self._fail(
                        f"timed out after {timeout_s:.1f}s waiting for {', '.join(names)}", names
                    )
                ready = multiprocessing.connection.wait(
                    [self._conns[r] for r in pending], timeout=min(remaining, WATCHDOG_POLL_S)
                )
                for rank in sorted(pending):
                    conn = self._conns[rank]
                    if conn not in ready:
                        continue
                    kind, payload, *blamed = self._receive(rank)
                    if kind == MSG_ERROR:
                        # The reporter exits after reporting: only a dead peer is a cause.
                        self._raise_if_any_dead(grace_s=ROOT_CAUSE_GRACE_S, reported=payload,
                                                reporter=rank)
                        # A peer-wait error blames the peer(s) it waited on (a frozen
                        # rank never reports); any other error blames the reporter.
                        self._fail(payload, list(blamed[0]) if blamed and blamed[0]
                                   else [self.spec(rank).name])
                    if kind != expect:
                        name = self.spec(rank).name
                        self._fail(f"{name} replied {kind!r}, expected {expect!r}", [name])
                    replies[rank] = payload
                    pending.discard(rank)
                # After the replies: a rank that reported its error and exited (a forked
                # rank exits at once) is named by its own message, not as merely dead.
                self._raise_if_any_dead()
        except BaseException:  # KeyboardInterrupt included: never leave children behind
            self.kill_all()
            raise
        return replies

    def _raise_if_any_dead(self, grace_s: float = 0.0, reported: str | None = None,
                           reporter: int | None = None) -> None:
        """Fail naming every child that has exited (but ``reporter``, whose error is in
        hand); wait up to grace_s for one to appear."""
        deadline = time.monotonic() + grace_s
        while True:
            dead = [
                (rank, process)
                for rank, process in self._processes.items()
                if rank != reporter and not process.is_alive()
            ]
            if dead or time.monotonic() >= deadline:
                break
            time.sleep(WATCHDOG_POLL_S)
        if not dead:
            return
        parts = [
            f"{self.spec(rank).name} (pid {process.pid}) died with {_describe_exit(process.exitcode)}"
            for rank, process in dead
        ]
        message = "; ".join(parts)
        if reported:
            message += f"\nfirst error reported by a surviving rank: {reported}"
        self._fail(message, [self.spec(rank).name for rank, _ in dead])

    def _fail(self, message: str, rank_names: Sequence[str]) -> NoReturn:
        self.kill_all()
        raise AfdRankFailure(f"AFD runtime failed: {message}", rank_names=rank_names)

    def shutdown(self) -> None:
        """Polite stop (shutdown message, bounded join), then force whatever is left."""
        if self.closed:
            return
        for rank, conn in self._conns.items():
            if self._processes[rank].is_alive():
                with contextlib.suppress(BrokenPipeError, OSError):
                    conn.send((MSG_SHUTDOWN,))
        deadline = time.monotonic() + SHUTDOWN_JOIN_S
        for process in self._processes.values():
            process.join(max(0.0, deadline - time.monotonic()))
        self.kill_all()

    def kill_all(self) -> None:
        """SIGKILL every child still running and reap them all; idempotent."""
        for process in self._processes.values():
            if process.is_alive():
                with contextlib.suppress(OSError):
                    process.kill()
        for process in self._processes.values():
            process.join(KILL_JOIN_S)
        for conn in self._conns.values():
            conn.close()
        self.closed = True

    def alive_pids(self) -> list[int]:
        return [p.pid for p in self._processes.values() if p.is_alive()]


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "no exit code yet"
    if exitcode < 0:
        return f"signal {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"
