"""Unit tests of the Stage D candidates, planner mirror and best-size pick (no backend)."""

from __future__ import annotations

import pytest
from stage_d_chunks import (
    UNCHUNKED,
    best_sizes,
    chunk_label,
    plan_sweep,
    planner_config,
    scaled_candidates,
)

from pytest_afd.core.backend import RunSettings


def test_stage_d_candidates_scale_the_rfc_sizes():
    assert scaled_candidates(lambda tokens: tokens // 64) == [128, 256, 512, 1024, None]
    assert chunk_label(None) == "unchunked" and chunk_label(128) == "chunk128"


def test_stage_d_planner_mirrors_the_run_settings():
    settings = RunSettings(
        chunk_size=256, block_size=16, pcp_size=8, max_num_batched_tokens=2048, max_num_seqs=4
    )
    config = planner_config(settings, round_capacity=128)
    assert (config.chunk_size, config.page_size, config.cp_size) == (256, 16, 8)
    assert (config.max_batched_tokens, config.request_slots, config.round_capacity) == (
        2048,
        4,
        128,
    )


def test_stage_d_invalid_sizes_carry_the_planner_reason():
    settings = RunSettings(block_size=16, pcp_size=1, max_num_batched_tokens=512)
    candidates = plan_sweep([300, 40, 40], [100, 256, 1024, UNCHUNKED], settings, 8192)
    verdicts = {c.chunk_size: (c.plan.valid, "; ".join(c.plan.reasons)) for c in candidates}
    assert verdicts[256] == (True, "")
    assert verdicts[UNCHUNKED] == (True, "")
    assert not verdicts[100][0] and "not a multiple of page size 16" in verdicts[100][1]
    assert not verdicts[1024][0] and "exceeds max batched tokens 512" in verdicts[1024][1]


def test_stage_d_planner_needs_a_resolved_pcp_size():
    with pytest.raises(ValueError, match=r"explicit RunSettings\.pcp_size"):
        planner_config(RunSettings(block_size=16), round_capacity=128)


def test_stage_d_best_sizes_exclude_the_unchunked_reference():
    throughput = {128: 10.0, 256: 30.0, 512: 20.0, UNCHUNKED: 99.0}
    assert best_sizes(throughput) == [256, 512]
    assert best_sizes({128: 5.0, UNCHUNKED: 1.0}) == [128]
    assert best_sizes({128: 5.0, 256: 5.0}) == [128, 256]  # ties: smaller first
