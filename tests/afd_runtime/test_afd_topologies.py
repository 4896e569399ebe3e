"""Data-parallel Attention ranks and expert-parallel FFN ranks (2 + 1, 2 + 2): slow."""

import numpy as np
import pytest

from pytest_afd.backends.cpu.afd import AfdRuntime
from pytest_afd.core.absent import is_absent
from tests.support.afd_runtime_helpers import (
    SEED,
    THREADS_PER_RANK,
    child_pids,
    make_batch,
    plan_for,
    reference_forward,
)

BATCHES = ([70, 10, 16], [24, 24, 30])


@pytest.mark.slow  # four ranks share two cores: ~40 s with start-up
@pytest.mark.parametrize("num_ffn", [1, 2])
def test_two_attention_ranks_match_executor_per_rank(afd_config, reference_model, num_ffn):
    runtime = AfdRuntime(afd_config, SEED, num_attention=2, num_ffn=num_ffn,
                         threads_per_rank=THREADS_PER_RANK)
    try:
        for policy in ("request_boundary", "token_balanced"):
            _check_policy(runtime, afd_config, reference_model, num_ffn, policy)
    finally:
        runtime.close()
    assert not (set(runtime.pids.values()) & child_pids())


def _check_policy(runtime, afd_config, reference_model, num_ffn, policy):
    batches = [make_batch(afd_config, lengths, seed=20 + i) for i, lengths in enumerate(BATCHES)]
    plans = [plan_for(metadata, policy) for _, metadata in batches]
    results = runtime.run_dp_forward(
        [(ids, metadata, plan, None) for (ids, metadata), plan in zip(batches, plans, strict=True)],
        instrument=True, stage_dense_layers=True,
    )
    for batch, plan, result in zip(batches, plans, results, strict=True):
        (expected,) = reference_forward(reference_model, [batch], [plan])
        reference = expected.last_logits.numpy()
        if num_ffn == 1:
            np.testing.assert_array_equal(result.logits, reference)
        else:  # expert-parallel partial sums add in another order
            np.testing.assert_allclose(result.logits, reference, rtol=1e-5, atol=1e-5)
            assert result.logits.argmax(-1).tolist() == expected.next_tokens.tolist()
        np.testing.assert_array_equal(np.asarray(result.expert_load), expected.expert_load)
    evidence = results[0].evidence
    assert evidence["topology"] == {"num_attention": 2, "num_ffn": num_ffn}
    rows = sum(u.num_rows for plan in plans for u in plan.ubatches) * len(afd_config.moe_layer_indices)
    served = evidence["ffn_rows_served"]
    if num_ffn == 1:
        assert served == {"FFN rank 0": rows}
        assert is_absent(evidence["straggler_s"])  # nobody to straggle against: not 0
    else:
        per_rank = [sum(layer["ffn_rank_tokens"][f] for layer in evidence["load"]["per_layer"])
                    for f in range(num_ffn)]
        assert all(n > 0 for n in served.values()) and sum(per_rank) > 0
        assert evidence["straggler_s"] >= 0.0


@pytest.mark.slow  # a fresh runtime: ~15 s
def test_runtime_loads_pretrained_weights(tmp_path, afd_config):
    from pytest_afd.backends.cpu import DeepseekV32Model, init_weights, save_pretrained

    weights = init_weights(afd_config, SEED + 1)  # not the runtime's seed: must come from disk
    save_pretrained(afd_config, weights, tmp_path)
    model = DeepseekV32Model(afd_config, weights)
    ids, metadata = make_batch(afd_config, [30, 20], seed=31)
    plan = plan_for(metadata, "token_balanced")
    with AfdRuntime(afd_config, SEED, threads_per_rank=THREADS_PER_RANK, model_dir=str(tmp_path)) as runtime:
        result = runtime.run_forward(ids, metadata, plan, stage_dense_layers=True)
    (expected,) = reference_forward(model, [(ids, metadata)], [plan])
    np.testing.assert_array_equal(result.logits, expected.last_logits.numpy())
