"""The rank process's side of the AFD runtime: its entry point and what it is given.

A rank is forked from multiprocessing's fork server, a clean process that has imported
torch and the role's module but never run an operator (so no intra-op pool exists to
deadlock a fork), instead of a spawned interpreter importing torch again. What a
spawned child would inherit at start, it is handed: the parent's current environment
and its stdout/stderr (so its output lands in the test's capture, as before).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime
import multiprocessing.connection
import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing import reduction
from typing import Any

from pytest_afd.backends.cpu.afd.protocol import (
    MSG_ERROR,
    MSG_OK,
    MSG_PORT,
    MSG_READY,
    MSG_SHUTDOWN,
    PeerWaitError,
    RankSpec,
)

LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo"
GLOO_INTERFACE_ENV = "GLOO_SOCKET_IFNAME"
PR_SET_PDEATHSIG = 1
"""Linux prctl option: signal this process gets when its parent thread exits."""
STANDARD_STREAMS = (1, 2)


class InheritedFd:
    """One of the parent's file descriptors, duplicated into the child at start.

    Pickled only while multiprocessing starts the child (``reduction.DupFd`` hands the
    descriptor to the start method); unpickled in the child as a plain descriptor.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _detach, (reduction.DupFd(self.fd),)


def _detach(duplicated) -> int:
    return duplicated.detach()


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
    environ: Mapping[str, str] = field(default_factory=dict)  # the parent's, at start
    streams: tuple[InheritedFd, ...] = ()  # the parent's stdout and stderr, at start


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this child when the parent dies (no orphans after a hard kill)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    libc = ctypes.CDLL(libc_name, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _take_over_start_state(config: WorkerConfig) -> None:
    """Become what a spawned child would be: the parent's environment and output streams.

    The fork server's own were frozen when it started, maybe tests ago.
    """
    os.environ.clear()
    os.environ.update(config.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    for target, inherited in zip(STANDARD_STREAMS, config.streams, strict=True):
        os.dup2(inherited, target)
        os.close(inherited)


def worker_main(conn: multiprocessing.connection.Connection, config: WorkerConfig) -> None:
    """Child entry point: pin threads, join gloo, build the role, serve commands."""
    parent_pid = os.getppid()
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)
    _take_over_start_state(config)
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
        # start meanwhile): no rank can join another runtime's store through
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
