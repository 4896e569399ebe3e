"""Child processes of the AFD runtime: spawn, gloo rendezvous, bounded waits, cleanup.

Every Attention and FFN rank is its own OS process (spawned, never forked: a
forked torch with live intra-op pools deadlocks). The parent is not a member of
the gloo group; it talks to each rank over a multiprocessing pipe and is the
watchdog: every wait it does is bounded, it notices a dead child through the
process sentinel, and any failure tears down every child before the error
reaches the caller, so no orphan outlives a failed run, a test session or a
Ctrl-C. Children also ask the kernel to kill them if the parent dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo"
GLOO_INTERFACE_ENV = "GLOO_SOCKET_IFNAME"
ADDRESS_IN_USE = "address already in use"
PR_SET_PDEATHSIG = 1
"""Linux prctl option: signal this process gets when its parent thread exits."""

WATCHDOG_POLL_S = 0.05
"""How often the parent re-checks child liveness while it waits for replies."""

ROOT_CAUSE_GRACE_S = 0.5
"""After a rank reports an error, how long to look for a dead peer that caused it."""

SHUTDOWN_JOIN_S = 5.0
KILL_JOIN_S = 2.0

MSG_READY = "ready"
MSG_PORT = "port"
"""Rank 0's first message: the port its rendezvous store really bound."""
EPHEMERAL_PORT = 0
"""Ask the kernel for a free port at bind time (no probe-then-bind race)."""
MSG_OK = "ok"
MSG_ERROR = "error"
MSG_SHUTDOWN = "shutdown"

ROLE_ATTENTION = "attention"
ROLE_FFN = "ffn"


class AfdRuntimeError(RuntimeError):
    """The AFD runtime failed; the message names the rank(s) responsible."""


class AfdRankFailure(AfdRuntimeError):
    """A rank died, raised, or stopped answering within its bound."""

    def __init__(self, message: str, *, rank_names: Sequence[str]) -> None:
        super().__init__(message)
        self.rank_names = tuple(rank_names)


class PeerWaitError(RuntimeError):
    """Raised in a rank whose bounded wait on ``peers`` failed: they are blamed, not it.

    Why: a frozen FFN rank reports nothing; the Attention rank waiting on it is
    the one that times out, and blaming the reporter would name the healthy rank.
    """

    def __init__(self, message: str, *, peers: Sequence[str]) -> None:
        super().__init__(message)
        self.peers = tuple(peers)


@dataclass(frozen=True)
class RankSpec:
    """One process of the topology: its role, index within the role, and gloo rank."""

    role: str
    role_index: int
    global_rank: int

    @property
    def name(self) -> str:
        label = "Attention" if self.role == ROLE_ATTENTION else "FFN"
        return f"{label} rank {self.role_index}"


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a child needs to join the group and build its role (picklable)."""

    spec: RankSpec
    world_size: int
    master_port: int | None  # rank 0: the port to bind (EPHEMERAL_PORT: any); others: None,
    # rank 0's port arrives on the pipe once rank 0 holds it
    num_threads: int
    collective_timeout_s: float
    role_factory: Callable[..., Any]
    role_kwargs: Mapping[str, Any] = field(default_factory=dict)
    cpu_core: int | None = None  # pin the process (and its threads) to this core
    nice: int = 0  # scheduling niceness of the process (and its threads); 0: unchanged


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child when the parent dies (no orphans after a hard kill)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    libc = ctypes.CDLL(libc_name, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def worker_main(conn: multiprocessing.connection.Connection, config: WorkerConfig) -> None:
    """Child entry point: pin threads, join gloo, build the role, serve commands."""
    parent_pid = os.getppid()
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    # Ctrl-C reaches the whole process group; the parent decides how children end.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if config.cpu_core is not None:  # before torch starts its threads: they inherit it
        os.sched_setaffinity(0, {config.cpu_core})
    if config.nice:  # likewise before torch's threads exist: Linux niceness is per thread
        try:
            os.setpriority(os.PRIO_PROCESS, 0, config.nice)
        except OSError as exc:  # a negative niceness needs CAP_SYS_NICE
            conn.send((MSG_ERROR, f"{config.spec.name} could not set niceness {config.nice}: {exc!r}"))
            return
    import torch
    import torch.distributed as dist

    torch.set_num_threads(config.num_threads)
    # Gloo picks its transport address from the hostname unless told otherwise;
    # the ranks live on one host, so pin the transport to loopback.
    os.environ.setdefault(GLOO_INTERFACE_ENV, LOOPBACK_INTERFACE)
    name = config.spec.name
    timeout = datetime.timedelta(seconds=config.collective_timeout_s)
    try:
        # Rank 0 binds the store itself (port 0: the kernel picks a free one) and
        # tells the parent, which only then sends that port to the other ranks (they
        # import torch meanwhile): no rank can join another runtime's store through
        # a reused probed port.
        is_master = config.spec.global_rank == 0
        port = config.master_port
        if port is None:
            try:
                kind, port = conn.recv()
            except EOFError:  # the parent gave up on start-up (rank 0 failed)
                return
            if kind != MSG_PORT:
                raise RuntimeError(f"expected the rendezvous port first, got {kind!r}")
        store = dist.TCPStore(LOOPBACK, port, config.world_size,
                              is_master=is_master, timeout=timeout, wait_for_workers=False)
        if is_master:
            conn.send((MSG_PORT, store.port))
        dist.init_process_group("gloo", store=store, rank=config.spec.global_rank,
                                world_size=config.world_size, timeout=timeout)
        role = config.role_factory(config.spec, **config.role_kwargs)
        conn.send((MSG_READY, {"pid": os.getpid(), "threads": torch.get_num_threads()}))
    except Exception as exc:
        conn.send((MSG_ERROR, f"{name} failed to start: {exc!r}\n{traceback.format_exc()}"))
        return
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent went away: nothing left to serve
            return
        if message[0] == MSG_SHUTDOWN:
            break
        try:
            conn.send((MSG_OK, role.handle(message)))
        except Exception as exc:
            blamed = exc.peers if isinstance(exc, PeerWaitError) else ()
            conn.send((MSG_ERROR, f"{name}: {exc}\n{traceback.format_exc()}", blamed))
            # A failed step leaves the gloo channels in an unknown state; the
            # parent tears the whole group down, so stop serving.
            return
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    # A clean stop has nothing left to run at exit (replies sent, traces written in
    # the step): skip the interpreter's ~1 s teardown of torch, as a forked child does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
        context = multiprocessing.get_context("spawn")
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
                self._raise_if_any_dead()
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
