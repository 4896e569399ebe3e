"""Issue 23 rows 8 and 13: a frozen rank is the one blamed; runtimes never share a rendezvous.

Row 8: ``kill -STOP`` one rank mid-run; the rank that times out waiting on it
reports, and ``rank_names`` holds the frozen peer, not the reporter.
Row 13: a runtime forced onto another runtime's rendezvous port fails on its
own rank 0 alone (the others join only once rank 0 holds its port) and
retries on a kernel-chosen port; both runtimes keep working. The two port cases
share the runtime whose port is taken (they only run forwards on it).
Bounds are generous (well above the peer timeout); nothing asserts a tight timer.
"""

import os
import signal
import time

import pytest

from pytest_afd.backends.cpu import named_config
from pytest_afd.backends.cpu.afd import AfdRankFailure, AfdRuntime
from tests.support.afd_runtime_helpers import SEED, child_pids, make_batch, plan_for

PEER_TIMEOUT_S = 2.0
FAILURE_BOUND_S = 60.0
STARTUP_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def small_config():
    return named_config("reduced", num_hidden_layers=4, first_k_dense_replace=1)


@pytest.fixture(scope="module")
def first(small_config):
    """The runtime holding the port the port cases force another runtime onto."""
    runtime = _start(small_config)
    yield runtime
    runtime.close()


def _start(config, **kwargs):
    return AfdRuntime(config, SEED, num_attention=1, num_ffn=1, threads_per_rank=1,
                      startup_timeout_s=STARTUP_TIMEOUT_S, **kwargs)


def _batch(config):
    ids, metadata = make_batch(config, [40, 24], seed=5)
    return ids, metadata, plan_for(metadata, "token_balanced")


@pytest.mark.parametrize(("frozen", "healthy"), [("FFN rank 0", "Attention rank 0"),
                                                 ("Attention rank 0", "FFN rank 0")])
def test_a_frozen_rank_is_the_one_blamed(small_config, frozen, healthy):
    runtime = _start(small_config, peer_timeout_s=PEER_TIMEOUT_S)
    batch = _batch(small_config)
    runtime.run_forward(*batch)  # healthy first: the freeze hits a runtime that worked
    pid = runtime.pids[frozen]
    os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        with pytest.raises(AfdRankFailure, match=rf"timed out.*from {frozen}") as info:
            runtime.run_forward(*batch)
    finally:
        runtime.close()  # SIGKILL reaches a stopped process
    assert time.monotonic() - start < PEER_TIMEOUT_S + FAILURE_BOUND_S
    assert info.value.rank_names == (frozen,), str(info.value)
    assert f"{healthy}: timed out" in str(info.value)  # the reporter is still named as such
    assert not (set(runtime.pids.values()) & child_pids())


def test_a_runtime_forced_onto_a_taken_rendezvous_port_retries_and_both_work(small_config, first):
    taken = first.rendezvous_port
    assert isinstance(taken, int) and taken > 0
    start = time.monotonic()
    second = _start(small_config, rendezvous_port=taken)
    try:
        assert time.monotonic() - start < STARTUP_TIMEOUT_S / 2  # no start-up timeout hit
        assert second.rendezvous_port not in (None, taken)
        batch = _batch(small_config)
        for runtime in (first, second):  # the first runtime's FFN rank is still its own
            result = runtime.run_forward(*batch)
            assert result.hidden.shape[0] == batch[1].num_tokens
    finally:
        second.close()


def test_a_taken_port_fails_rank_zero_alone_without_a_retry_path(small_config, first,
                                                                 monkeypatch):
    """Without the retry, the forced start fails fast naming rank 0's bind, not an FFN join."""
    before = child_pids()
    monkeypatch.setattr("pytest_afd.backends.cpu.afd.runtime.ADDRESS_IN_USE",
                        "a message no failure carries")
    start = time.monotonic()
    with pytest.raises(AfdRankFailure, match=r"(?i)address already in use") as info:
        _start(small_config, rendezvous_port=first.rendezvous_port)
    assert time.monotonic() - start < STARTUP_TIMEOUT_S / 2
    assert info.value.rank_names == ("Attention rank 0",)
    assert child_pids() <= before  # the failed start left no rank behind
    assert first.run_forward(*_batch(small_config)).logits.size
