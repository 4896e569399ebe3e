"""A rank lost between steps or just before one: the failure names it; the backend recovers.

Each failure closes its runtime, so every test starts its own (small model).
Nothing here asserts on timing beyond generous bounds.
"""

import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

from pytest_afd.backends.cpu import create, named_config
from pytest_afd.backends.cpu.afd import AfdRankFailure, AfdRuntime, AfdRuntimeError
from pytest_afd.backends.cpu.afd.procs import ProcessGroupHandle
from pytest_afd.backends.cpu.afd.protocol import MSG_ERROR, MSG_PORT, ROLE_ATTENTION, RankSpec
from pytest_afd.core.backend import PromptRequest, RunSettings
from tests.support.afd_runtime_helpers import SEED, child_pids, make_batch, plan_for

SMALL_MODEL = "reduced:num_hidden_layers=4,first_k_dense_replace=1"
KILL_AFTER_SEND_S = 1.0
DEATH_BOUND_S = 10.0
DEATH_POLL_S = 0.01
BLOCK_SIZE = 16


@pytest.fixture
def small_config():
    return named_config("reduced", num_hidden_layers=4, first_k_dense_replace=1)


def _healthy_runtime(config):
    runtime = AfdRuntime(config, SEED, num_attention=1, num_ffn=1, threads_per_rank=1)
    ids, metadata = make_batch(config, [40, 24], seed=3)
    runtime.run_forward(ids, metadata, plan_for(metadata, "token_balanced"))
    return runtime, (ids, metadata, plan_for(metadata, "token_balanced"))


def _wait_dead(pid):
    """Block (bounded) until the rank has exited; its parent, the fork server, reaps it."""
    deadline = time.monotonic() + DEATH_BOUND_S
    while pid in child_pids():
        assert time.monotonic() < deadline, f"rank pid {pid} still runs after SIGKILL"
        time.sleep(DEATH_POLL_S)


def _assert_closed_and_reaped(runtime):
    assert runtime.closed
    assert not (set(runtime.pids.values()) & child_pids())


@pytest.mark.parametrize("victim", ["FFN rank 0", "Attention rank 0"])
def test_rank_killed_between_steps_is_named(small_config, victim):
    runtime, batch = _healthy_runtime(small_config)
    pid = runtime.pids[victim]
    os.kill(pid, signal.SIGKILL)
    _wait_dead(pid)
    with pytest.raises(AfdRankFailure, match=rf"{victim} \(pid {pid}\) died with signal SIGKILL"):
        runtime.run_forward(*batch)
    with pytest.raises(AfdRuntimeError, match="closed"):
        runtime.run_forward(*batch)
    _assert_closed_and_reaped(runtime)


def test_attention_rank_killed_just_before_a_step_is_named(small_config):
    """The command reaches a stopped rank that is then killed with it unread."""
    runtime, batch = _healthy_runtime(small_config)
    pid = runtime.pids["Attention rank 0"]
    os.kill(pid, signal.SIGSTOP)
    killer = threading.Timer(KILL_AFTER_SEND_S, os.kill, (pid, signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(AfdRankFailure) as info:
            runtime.run_forward(*batch)
    finally:
        killer.cancel()
        runtime.close()
    assert info.value.rank_names == ("Attention rank 0",)
    assert "Attention rank 0" in str(info.value)
    _assert_closed_and_reaped(runtime)


class _ResetConnection:
    """A pipe end that is readable but whose read fails as a killed peer's pipe does."""

    def __init__(self, real):
        self._real = real

    def fileno(self):
        return self._real.fileno()

    def recv(self):
        raise ConnectionResetError(104, "Connection reset by peer")

    def send(self, message):
        self._real.send(message)

    def close(self):
        self._real.close()


class _LiveProcess:
    """Stands in for a rank that the watchdog has not yet seen die."""

    pid = 0
    exitcode = None

    def is_alive(self):
        return True

    def kill(self):
        pass

    def join(self, timeout=None):
        pass


def test_reset_pipe_while_reading_a_reply_names_the_rank():
    """The race the watchdog cannot close: the rank looks alive, its pipe is already reset."""
    handle = ProcessGroupHandle(
        [RankSpec(ROLE_ATTENTION, 0, 0)], num_threads=1, collective_timeout_s=1.0,
        role_factory=None, role_kwargs_for=lambda spec: {},
    )
    ours, theirs = multiprocessing.Pipe()
    handle._conns[0] = _ResetConnection(ours)
    handle._processes[0] = _LiveProcess()
    theirs.send("readable")
    with pytest.raises(AfdRankFailure, match="Attention rank 0 closed its pipe") as info:
        handle.request({0: ("forward", {})}, timeout_s=30.0)
    assert info.value.rank_names == ("Attention rank 0",)
    assert "ConnectionResetError" in str(info.value)
    assert handle.closed
    theirs.close()



class _ExitedProcess(_LiveProcess):
    """A rank that has already exited cleanly (exit code 0)."""

    exitcode = 0

    def is_alive(self):
        return False


def test_a_rank_that_reported_its_error_and_exited_is_named_by_its_error():
    """A forked rank exits the moment it has sent its error (no interpreter teardown): the
    failure carries that error (what the port retry reads), not just the exit."""
    handle = ProcessGroupHandle(
        [RankSpec(ROLE_ATTENTION, 0, 0)], num_threads=1, collective_timeout_s=1.0,
        role_factory=None, role_kwargs_for=lambda spec: {},
    )
    ours, theirs = multiprocessing.Pipe()
    handle._conns[0] = ours
    handle._processes[0] = _ExitedProcess()
    theirs.send((MSG_ERROR, "Attention rank 0 failed to start: address already in use"))
    with pytest.raises(AfdRankFailure, match="address already in use") as info:
        handle._gather([0], 30.0, expect=MSG_PORT)
    assert info.value.rank_names == ("Attention rank 0",)
    theirs.close()

def _prompts():
    rng = np.random.default_rng(0)
    return [PromptRequest(f"r{i}", tuple(rng.integers(0, 1000, n).tolist()))
            for i, n in enumerate((70, 30))]


def test_backend_starts_a_fresh_runtime_after_a_rank_failure():
    before = child_pids()
    backend = create(topology=None, model_name=SMALL_MODEL, seed=0, results_dir=None)
    settings = RunSettings(block_size=BLOCK_SIZE, afd_processes=True, prefix_caching=True)
    try:
        first = backend.run(_prompts(), settings)
        failed_pids = backend._afd_runtime.pids
        victim = failed_pids["FFN rank 0"]
        os.kill(victim, signal.SIGKILL)
        _wait_dead(victim)
        with pytest.raises(AfdRankFailure, match="FFN rank 0"):
            backend.run(_prompts(), settings)
        # The next case gets a fresh runtime (and a cold prefix cache), not "closed".
        backend.reset_prefix_cache()
        again = backend.run(_prompts(), settings)
        assert set(backend._afd_runtime.pids.values()).isdisjoint(failed_pids.values())
        assert [r.num_cached_tokens for r in again.requests] == [0, 0]
        for a, b in zip(first.requests, again.requests, strict=True):
            assert a.next_token == b.next_token
        local = backend.run(_prompts(), RunSettings(block_size=BLOCK_SIZE, return_logits=True))
        remote = backend.run(_prompts(), RunSettings(block_size=BLOCK_SIZE, return_logits=True,
                                                     afd_processes=True))
        for a, b in zip(local.requests, remote.requests, strict=True):
            assert np.array_equal(a.logits, b.logits)
    finally:
        backend.close()
    assert child_pids() <= before
