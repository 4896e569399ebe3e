"""The CPU backend runs an AFD topology through the runtime (``RunSettings.afd_processes``).

Same backend, same schedule: Attention + FFN processes must give the in-process
executor's logits bit for bit, carry the runtime's evidence in every step, keep
prefix caching working on the Attention rank's cache, and leave no process behind.
"""

import numpy as np
import pytest

from pytest_afd.backends.cpu import create
from pytest_afd.core.backend import CAP_AFD, PromptRequest, RunSettings
from pytest_afd.topology.spec import parse_topology
from tests.support.afd_runtime_helpers import child_pids

# The reduced model's shape with fewer layers (as the other runtime tests use).
MODEL_NAME = "reduced:num_hidden_layers=5,first_k_dense_replace=2"
BLOCK_SIZE = 16
LENGTHS = (150, 41, 90)
SHARED_PREFIX = 64


def _prompts(lengths, prefix_len=0, seed=0):
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 1000, prefix_len).tolist()
    return [
        PromptRequest(f"r{i}", tuple(prefix + rng.integers(0, 1000, n - prefix_len).tolist()))
        for i, n in enumerate(lengths)
    ]


@pytest.fixture(scope="module")
def backend():
    before = child_pids()
    cpu = create(topology=parse_topology("dp3pcp8-ep8"), model_name=MODEL_NAME, seed=0,
                 results_dir=None)
    yield cpu
    cpu.close()
    assert child_pids() <= before, "AFD ranks survived CpuBackend.close()"


def _settings(**overrides):
    return RunSettings(block_size=BLOCK_SIZE, max_num_seqs=len(LENGTHS), **overrides)


@pytest.mark.parametrize("policy", ["none", "request_boundary", "token_balanced"])
def test_afd_processes_match_in_process_bit_for_bit(backend, policy):
    assert CAP_AFD in backend.capabilities
    prompts = _prompts(LENGTHS)
    local = backend.run(prompts, _settings(split_policy=policy))
    remote = backend.run(prompts, _settings(split_policy=policy, afd_processes=True))
    for a, b in zip(local.requests, remote.requests, strict=True):
        assert np.array_equal(a.logits, b.logits), f"{policy}: {a.request_id} differs"
    assert [s["ubatches"] for s in local.steps] == [s["ubatches"] for s in remote.steps]
    assert all("afd" in step for step in remote.steps)
    assert not any("afd" in step for step in local.steps)


def test_instrumented_afd_steps_carry_overlap_evidence(backend):
    run = backend.run(_prompts(LENGTHS), _settings(afd_processes=True, instrument=True))
    for step in run.steps:
        assert 0.0 <= step["overlap_fraction"] <= 1.0
        assert step["exposed_bubble_s"] >= 0.0
        straggler = step["straggler_s"]  # one FFN rank: absent with its reason, never 0
        assert straggler["value"] is None and "one FFN rank" in straggler["absent_reason"]
        assert step["afd"]["instrumented"] is True
    # The same run's torch.profiler traces, through the evidence code NPU profiles use.
    pytest.importorskip("msprof_analyze", reason="msprof-analyze not installed (extra [profile])")
    profile = run.profile
    assert profile is not None, run.timings.get("profile_problem")
    assert profile["source"] == "torch_trace"
    assert len(profile["per_step"]) == len(run.steps)
    assert {row["component"] for row in profile["per_layer"]} >= {"attention", "routed_moe"}
    assert 0.0 < profile["roles"]["ffn"]["busy_fraction"] <= 1.0
    plain = backend.run(_prompts(LENGTHS), _settings(afd_processes=True))
    assert plain.profile is None


def test_prefix_cache_on_the_attention_rank(backend):
    backend.reset_prefix_cache()
    prompts = _prompts((120, 100), prefix_len=SHARED_PREFIX, seed=1)
    settings = _settings(afd_processes=True, prefix_caching=True)
    cold = backend.run(prompts, settings)
    warm = backend.run(prompts, settings)
    # Lookups happen when the queue is admitted, so the cold run hits nothing.
    assert [r.num_cached_tokens for r in cold.requests] == [0, 0]
    assert all(r.num_cached_tokens >= SHARED_PREFIX for r in warm.requests)
    uncached = backend.run(prompts, _settings())
    for w, u in zip(warm.requests, uncached.requests, strict=True):
        assert np.array_equal(w.logits, u.logits)


def test_runtime_fails_closed_before_any_rank_exists():
    from afd_split import UnsupportedSplitError
    from afd_split.checks.support import SplitSupportConfig
    from pytest_afd.backends.cpu import named_config
    from pytest_afd.backends.cpu.afd import AfdRuntime

    before = child_pids()
    graph_mode = SplitSupportConfig(attention_builder="CPUReferenceAttentionBuilder",
                                    graph_mode="full_decode_only")
    with pytest.raises(UnsupportedSplitError, match="graph"):
        AfdRuntime(named_config("reduced"), 0, support=graph_mode)
    assert child_pids() == before, "a rank was started for an unsupported combination"
