"""The attach-mode tests' CPU servers, started once per (worker) session."""

from __future__ import annotations

import pytest

from tests.support.ascend_deployments import DEPLOYMENT_VARIABLES, cpu_servers

SHARED_POLICIES = ("none", "token_balanced")


@pytest.fixture(scope="session")
def policy_servers(tmp_path_factory):
    """split policy -> a running CPU server at the shared small settings (split-none and
    token_balanced), started once and shared by every attach-mode test that reads it.

    Why shared: each start imports torch and builds the model (seconds of CPU), and the
    tests only send cases to them; none stops a server or depends on what another sent.
    A test that needs a server of its own (a stopped one, other settings) starts it itself.
    The servers start without the deployment variables, as the tests' own did.
    """
    with pytest.MonkeyPatch.context() as patch:
        for name in DEPLOYMENT_VARIABLES:
            patch.delenv(name, raising=False)
        group = cpu_servers(tmp_path_factory.mktemp("policy-servers"), *SHARED_POLICIES).start()
    try:
        yield dict(zip(SHARED_POLICIES, group.servers, strict=True))
    finally:
        group.stop()
