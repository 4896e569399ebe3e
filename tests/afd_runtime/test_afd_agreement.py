"""The CPU AFD runtime's debug-mode fingerprint agreement: every step, every rank, fail closed."""

import pytest

from afd_split import SplitConstraints
from afd_split.hook.planning.engine_step import plan_engine_step
from pytest_afd.backends.cpu.afd import AfdRuntime, AfdRuntimeError
from tests.support.afd_runtime_helpers import SEED, THREADS_PER_RANK, make_batch

TOKENS = [100, 100, 100, 100]


def _plan(computed):
    return plan_engine_step(TOKENS, policy="cost_balanced", constraints=SplitConstraints(),
                            num_computed_tokens=computed)


@pytest.fixture
def agreeing_runtime(afd_config):
    runtime = AfdRuntime(afd_config, SEED, num_attention=1, num_ffn=1,
                         threads_per_rank=THREADS_PER_RANK, check_agreement=True)
    yield runtime
    runtime.close()


def test_every_rank_agrees_on_the_step_plan(agreeing_runtime, afd_config):
    ids, metadata = make_batch(afd_config, TOKENS)
    plan = _plan([0, 0, 0, 0])
    for _ in range(2):
        result = agreeing_runtime.run_forward(ids, metadata, plan)
        agreed = result.evidence["agreed_fingerprints"]
        assert set(agreed) == {"Attention rank 0", "FFN rank 0"}
        assert all(fingerprints == [plan.fingerprint()] for fingerprints in agreed.values())


def test_ranks_holding_plans_that_differ_only_in_the_cut_fail_the_step(
    agreeing_runtime, afd_config, monkeypatch
):
    ids, metadata = make_batch(afd_config, TOKENS)
    plan, other = _plan([0, 0, 0, 0]), _plan([0, 0, 0, 4000])
    assert plan.split_token != other.split_token
    assert (plan.policy, plan.constraints) == (other.policy, other.constraints)
    group = agreeing_runtime._group
    request = group.request

    def misplanned_ffn(messages, timeout_s):  # the FFN rank holds the other cut
        for rank in agreeing_runtime.ffn_ranks:
            command, body = messages[rank]
            messages[rank] = (command, {**body, "agreement_plans": [other]})
        return request(messages, timeout_s)

    monkeypatch.setattr(group, "request", misplanned_ffn)
    with pytest.raises(AfdRuntimeError, match="disagree on the split plan"):
        agreeing_runtime.run_forward(ids, metadata, plan)


def test_agreement_is_off_unless_asked(afd_config, monkeypatch):
    monkeypatch.setenv("AFD_SPLIT_DEBUG_AGREE", "0")
    runtime = AfdRuntime(afd_config, SEED, num_attention=1, num_ffn=1,
                         threads_per_rank=THREADS_PER_RANK)
    try:
        assert runtime.check_agreement is False
        ids, metadata = make_batch(afd_config, TOKENS)
        assert runtime.run_forward(ids, metadata, _plan([0] * 4)).evidence[
            "agreed_fingerprints"] is None
    finally:
        runtime.close()
