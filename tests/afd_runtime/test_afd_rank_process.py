"""A rank forked from the fork server starts as a spawned one would: with the parent's
environment and output streams as they are when the rank starts, not as they were when
the fork server started (maybe tests ago)."""

import os
import sys

from pytest_afd.backends.cpu.afd.procs import ProcessGroupHandle
from pytest_afd.backends.cpu.afd.protocol import ROLE_ATTENTION, RankSpec

MARK_ENV = "AFD_TEST_RANK_MARK"
START_TIMEOUT_S = 60.0
REPLY_TIMEOUT_S = 30.0


class _EchoRole:
    def handle(self, message):
        return os.environ.get(MARK_ENV)


def echo_role(spec, **_):
    """Announces itself on both streams once marked; answers with the environment it was given."""
    if MARK_ENV in os.environ:
        print(f"stdout of {spec.name}", flush=True)
        print(f"stderr of {spec.name}", file=sys.stderr, flush=True)
    return _EchoRole()


def _start_one_rank() -> ProcessGroupHandle:
    handle = ProcessGroupHandle([RankSpec(ROLE_ATTENTION, 0, 0)], num_threads=1,
                                collective_timeout_s=REPLY_TIMEOUT_S, role_factory=echo_role,
                                role_kwargs_for=lambda spec: {})
    handle.start(START_TIMEOUT_S)
    return handle


def test_a_rank_gets_the_environment_and_streams_of_its_start(capfd, monkeypatch):
    with capfd.disabled():  # the fork server, if it starts here, keeps other streams
        first = _start_one_rank()
        try:
            assert first.request({0: ("echo",)}, REPLY_TIMEOUT_S) == {0: None}
        finally:
            first.shutdown()
    monkeypatch.setenv(MARK_ENV, "set after the fork server started")
    second = _start_one_rank()
    try:
        assert second.request({0: ("echo",)}, REPLY_TIMEOUT_S) == {
            0: "set after the fork server started"}
    finally:
        second.shutdown()
    captured = capfd.readouterr()
    assert "stdout of Attention rank 0" in captured.out
    assert "stderr of Attention rank 0" in captured.err
