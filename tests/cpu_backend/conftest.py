"""Shared fixtures of the CPU-backend tests: small seeded models (the prompt runner is cpu_runner)."""

from __future__ import annotations

import pytest

from pytest_afd.backends.cpu import build_model, named_config
from tests.support.cpu_runner import PCP_LENGTHS, Runner, make_prompts


@pytest.fixture(scope="session")
def reduced_model():
    return build_model(named_config("reduced"), seed=0)


@pytest.fixture(scope="session")
def sparse_model():
    """Reduced model whose indexer selects 48 keys, so short prompts exercise sparse attention."""
    return build_model(named_config("reduced", index_topk=48), seed=0)


@pytest.fixture(scope="session")
def pcp_prompts():
    """The PCP tests' prompts (``PCP_LENGTHS``)."""
    return make_prompts(PCP_LENGTHS)


@pytest.fixture(scope="session")
def pcp_unsplit(reduced_model, pcp_prompts):
    """The unsplit run every PCP split and seeded PCP fault is compared with (run once)."""
    out, _ = Runner(reduced_model).whole(pcp_prompts)
    return out
