"""Benchmark aids of the runtime: ranks pinned to cores, per-rank preemption counts."""

import os

import pytest

from pytest_afd.backends.cpu.afd import AfdRuntime
from pytest_afd.backends.cpu.afd.cores import allowed_cores, cpu_affinity
from tests.support.afd_runtime_helpers import SEED, make_batch, plan_for


def test_cpu_affinity_is_round_robin_over_allowed_cores():
    cores = allowed_cores()
    assert cpu_affinity(len(cores) + 1) == [*cores, cores[0]]


def test_pinned_ranks_run_on_their_core_and_report_preemptions(afd_config):
    with AfdRuntime(afd_config, SEED, threads_per_rank=1, pin_cpus=True) as runtime:
        expected = cpu_affinity(2)
        assert runtime.describe()["cpu_affinity"] == expected
        for name, core in (("Attention rank 0", expected[0]), ("FFN rank 0", expected[1])):
            assert os.sched_getaffinity(runtime.pids[name]) == {core}
        ids, metadata = make_batch(afd_config, [40, 24], seed=5)
        evidence = runtime.run_forward(ids, metadata, plan_for(metadata, "token_balanced")).evidence
    switches = evidence["involuntary_switches"]
    assert set(switches) == {"Attention rank 0", "FFN rank 0"}
    assert all(isinstance(n, int) and n >= 0 for n in switches.values())
    assert os.sched_getaffinity(0) == set(allowed_cores())  # the parent stays unpinned


def test_rank_niceness_reaches_every_rank_and_bad_values_are_named(afd_config):
    parent_nice = os.getpriority(os.PRIO_PROCESS, 0)
    with AfdRuntime(afd_config, SEED, threads_per_rank=1, rank_nice=3) as runtime:
        assert runtime.describe()["rank_nice"] == 3
        for pid in runtime.pids.values():
            assert os.getpriority(os.PRIO_PROCESS, pid) == 3  # absolute, not relative
    assert os.getpriority(os.PRIO_PROCESS, 0) == parent_nice  # the parent keeps its own
    for bad in (25, -21, 1.5, True):
        with pytest.raises(ValueError, match=f"rank_nice={bad!r}"):
            AfdRuntime(afd_config, SEED, rank_nice=bad)
