"""Properties over random queues: tokens conserved, no batch over its budget."""

from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_afd.scheduling import SchedulerConfig, schedule
from pytest_afd.scheduling.model import ceil_div


@st.composite
def queues_and_configs(draw):
    page = draw(st.sampled_from([1, 16, 64, 128]))
    dp_size = draw(st.sampled_from([1, 2, 3]))
    # At least 64 tokens per budget keeps the number of forwards (and the run time) small.
    aligned = st.integers(1, 64).map(lambda pages: pages * max(page, 64) * dp_size)
    # Arbitrary sizes too: most are invalid and must say why instead of scheduling.
    chunk = draw(st.one_of(st.none(), aligned, st.integers(64, 200_000)))
    config = SchedulerConfig(
        chunk_size=chunk,
        dp_size=dp_size,
        cp_size=draw(st.sampled_from([1, 2, 8])),
        page_size=page,
        max_prefill_reqs=draw(st.integers(1, 6)),
        max_batched_tokens=draw(st.integers(64 * 128, 140_000)),
        round_capacity=draw(st.sampled_from([256, 1024, 8192])),
    )
    prompts = draw(st.lists(st.integers(1, 20_000), max_size=12))
    cached = [draw(st.integers(0, length - 1)) for length in prompts]
    return prompts, cached, config


@settings(max_examples=200, deadline=None)
@given(queues_and_configs())
def test_tokens_conserved_and_budgets_respected(case):
    prompts, cached, config = case
    plan = schedule(prompts, config=config, cached_tokens=cached)
    if not plan.valid:
        assert plan.reasons and plan.batches == ()
        return
    assert plan.total_scheduled_tokens == sum(p - c for p, c in zip(prompts, cached, strict=True))
    assert sum(b.num_tokens for b in plan.batches) == plan.total_scheduled_tokens
    next_position = list(cached)
    for batch in plan.batches:
        assert 0 < batch.num_tokens <= batch.charged_tokens <= config.token_budget
        assert batch.charged_tokens % config.page_size == 0
        assert 1 <= batch.num_requests <= config.request_slots
        assert len(set(batch.request_indices)) == batch.num_requests
        assert sum(not c.is_final for c in batch.chunks) <= 1
        for chunk in batch.chunks:
            assert chunk.num_computed_tokens == next_position[chunk.request_index]
            next_position[chunk.request_index] += chunk.num_tokens
            if not chunk.is_final:
                assert chunk.num_tokens % config.page_size == 0
        assert batch.rows_per_rank >= sum(
            ceil_div(c.num_tokens, config.cp_size) for c in batch.chunks
        )
        assert batch.comm_rounds == ceil_div(batch.rows_per_rank, config.round_capacity)
    assert next_position == list(prompts)
    final_counts = [0] * len(prompts)
    for batch in plan.batches:
        for chunk in batch.chunks:
            final_counts[chunk.request_index] += chunk.is_final
    assert final_counts == [1] * len(prompts)
