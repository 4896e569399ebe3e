"""A dead, hung or interrupted FFN rank: bounded failure naming the rank, no orphans.

Each test needs a fresh runtime (a failure closes it), so they use a small model.
"""

import _thread
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from pytest_afd.backends.cpu import named_config
from pytest_afd.backends.cpu.afd import AfdRankFailure, AfdRuntime, AfdRuntimeError
from tests.support.afd_runtime_helpers import SEED, child_pids, make_batch, plan_for

# Failure must surface well inside this bound (the default peer timeout is minutes).
FAILURE_BOUND_S = 20.0
PEER_TIMEOUT_S = 2.0
INTERRUPT_AFTER_S = 1.5
GONE_POLL_S = 0.05

HOLD_A_RUNTIME = textwrap.dedent("""
    import time
    from pytest_afd.backends.cpu import named_config
    from pytest_afd.backends.cpu.afd import AfdRuntime
    config = named_config("reduced", num_hidden_layers=4, first_k_dense_replace=1)
    runtime = AfdRuntime(config, 7, num_attention=1, num_ffn=1, threads_per_rank=1)
    print(*runtime.pids.values(), flush=True)
    time.sleep(600)
""")


@pytest.fixture
def small_config():
    return named_config("reduced", num_hidden_layers=4, first_k_dense_replace=1)


def _start(config, **kwargs):
    return AfdRuntime(config, SEED, num_attention=1, num_ffn=1, threads_per_rank=1, **kwargs)


def _run_with_fault(runtime, config, mode):
    ids, metadata = make_batch(config, [40, 24], seed=11)
    plan = plan_for(metadata, "token_balanced")
    fault = {"mode": mode, "ffn_rank": 0, "layer": config.moe_layer_indices[1]}
    # A healthy step first: the fault hits mid-run of a runtime that worked.
    runtime.run_forward(ids, metadata, plan)
    start = time.monotonic()
    try:
        runtime.run_forward(ids, metadata, plan, fault=fault)
    finally:
        elapsed = time.monotonic() - start
    return elapsed


def _assert_no_ranks_left(runtime):
    pids = set(runtime.pids.values())
    assert not (pids & child_pids()), f"rank processes {pids & child_pids()} survived"
    assert runtime.closed


def test_killed_ffn_rank_fails_the_step_naming_it(small_config):
    runtime = _start(small_config)
    start = time.monotonic()
    with pytest.raises(AfdRankFailure, match=r"FFN rank 0 \(pid \d+\) died with signal SIGKILL") as info:
        _run_with_fault(runtime, small_config, "kill")
    assert time.monotonic() - start < FAILURE_BOUND_S
    assert "FFN rank 0" in info.value.rank_names
    _assert_no_ranks_left(runtime)
    with pytest.raises(AfdRuntimeError, match="closed"):
        _run_with_fault(runtime, small_config, "kill")


def test_hung_ffn_rank_times_out_naming_it(small_config):
    runtime = _start(small_config, peer_timeout_s=PEER_TIMEOUT_S)
    start = time.monotonic()
    with pytest.raises(AfdRankFailure, match=r"timed out.*from FFN rank 0") as info:
        _run_with_fault(runtime, small_config, "hang")
    assert time.monotonic() - start < PEER_TIMEOUT_S + FAILURE_BOUND_S
    assert info.value.rank_names == ("FFN rank 0",)  # the hung peer, not the rank that waited
    _assert_no_ranks_left(runtime)


@pytest.mark.slow  # ~15 s: a fresh runtime per failure
def test_raising_ffn_rank_reports_its_error(small_config):
    runtime = _start(small_config)
    with pytest.raises(AfdRankFailure, match=r"FFN rank 0: injected failure at layer"):
        _run_with_fault(runtime, small_config, "raise")
    _assert_no_ranks_left(runtime)


@pytest.mark.slow  # ~15 s: a fresh runtime per failure
def test_ctrl_c_during_a_step_kills_every_rank(small_config):
    runtime = _start(small_config)
    timer = threading.Timer(INTERRUPT_AFTER_S, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _run_with_fault(runtime, small_config, "hang")
    finally:
        timer.cancel()
    _assert_no_ranks_left(runtime)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_no_rank_outlives_a_hard_killed_parent():
    """SIGKILL gives the parent no chance to clean up: the ranks must still go."""
    parent = subprocess.Popen([sys.executable, "-c", HOLD_A_RUNTIME], stdout=subprocess.PIPE,
                              text=True)
    try:
        rank_pids = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(rank_pids) == 2, f"the runtime did not start: {rank_pids}"
        assert all(_running(pid) for pid in rank_pids)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(FAILURE_BOUND_S)
    deadline = time.monotonic() + FAILURE_BOUND_S
    while any(_running(pid) for pid in rank_pids) and time.monotonic() < deadline:
        time.sleep(GONE_POLL_S)
    survivors = [pid for pid in rank_pids if _running(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"rank processes {survivors} outlived their SIGKILLed parent"
