"""Fixtures of the AFD runtime tests: one 1 + 1 runtime per module."""

import pytest

from pytest_afd.backends.cpu import build_model, named_config
from pytest_afd.backends.cpu.afd import AfdRuntime
from tests.support.afd_runtime_helpers import SEED, THREADS_PER_RANK, child_pids


@pytest.fixture(scope="session")
def afd_config():
    # The reduced model's shape (3 dense + 7 MoE layers), fewer layers to keep tests quick.
    return named_config("reduced", num_hidden_layers=5, first_k_dense_replace=2)


@pytest.fixture(scope="session")
def reference_model(afd_config):
    return build_model(afd_config, SEED)


@pytest.fixture(scope="module")
def runtime_1p1(afd_config):
    before = child_pids()
    runtime = AfdRuntime(
        afd_config, SEED, num_attention=1, num_ffn=1, threads_per_rank=THREADS_PER_RANK
    )
    pids = set(runtime.pids.values())
    yield runtime
    runtime.close()
    assert not (pids & child_pids()), "AFD ranks survived close()"
    assert child_pids() <= before
