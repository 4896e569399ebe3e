"""The runtime's FFN straggler: a value with two or more FFN ranks, an absent record with one.

Built from synthetic spans through :func:`step_evidence` itself (no processes), so the
one-FFN-rank case is injected directly and its record checked, not inferred.
"""

import pytest

from pytest_afd.backends.cpu.afd.evidence import ATTENTION, FFN_IDLE, ROUTED_MOE, WAIT, Span
from pytest_afd.backends.cpu.afd.rank import RankLayout
from pytest_afd.backends.cpu.afd.step_evidence import ONE_FFN_RANK, step_evidence
from pytest_afd.backends.cpu.run_evidence import afd_step_fields
from pytest_afd.core.absent import is_absent


def _evidence(expert_s_by_ffn: list[list[float]]) -> dict:
    """One Attention rank, ``len(expert_s_by_ffn)`` FFN ranks; FFN rank f spends
    ``expert_s_by_ffn[f][u]`` on routed experts of (layer 1, ubatch u)."""
    layout = RankLayout(num_attention=1, num_ffn=len(expert_s_by_ffn), num_experts=4)
    spans = {0: [Span(0, ATTENTION, 1, 0, 0.0, 1.0), Span(0, WAIT, 1, 0, 1.0, 2.0, 1)]}
    for f, per_ubatch in enumerate(expert_s_by_ffn):
        rank = layout.ffn_global_rank(f)
        spans[rank] = [Span(rank, FFN_IDLE, 1, 0, 0.0, 1.0, 0)]
        start = 1.0
        for ubatch, seconds in enumerate(per_ubatch):
            spans[rank].append(Span(rank, ROUTED_MOE, 1, ubatch, start, start + seconds))
            start += seconds
    return step_evidence(topology=layout, spans=spans, plans=[], expert_loads=[],
                         ffn_routed_rows={}, step_time_s=2.0, instrumented=True,
                         cpu_time_s={})


def test_one_ffn_rank_gives_an_absent_straggler_with_its_reason_not_zero():
    evidence = _evidence([[0.5, 0.5]])
    assert evidence["straggler_s"] == {"value": None, "absent_reason": ONE_FFN_RANK}
    assert "one FFN rank" in ONE_FFN_RANK
    # The top-level copy Stage A reads is the same absent record, not a 0.
    assert is_absent(afd_step_fields(evidence)["straggler_s"])


def test_two_ffn_ranks_with_a_known_slower_rank_give_max_minus_mean():
    # FFN rank 1 takes 0.14 s against rank 0's 0.10 s on ubatch 0: 0.14 - 0.12 = 0.02 s;
    # on ubatch 1 both take 0.05 s: 0. Total 0.02 s.
    evidence = _evidence([[0.10, 0.05], [0.14, 0.05]])
    assert evidence["straggler_s"] == pytest.approx(0.02, abs=1e-12)
    assert afd_step_fields(evidence)["straggler_s"] == pytest.approx(0.02, abs=1e-12)


def test_balanced_ffn_ranks_measure_a_true_zero():
    # Two ranks that took the same time: 0 is measured here, not a stand-in for unknown.
    assert _evidence([[0.1], [0.1]])["straggler_s"] == 0.0


def test_a_rank_with_no_expert_work_on_a_ubatch_counts_as_zero_time_there():
    # Rank 1 ran nothing on ubatch 1 (its tokens all routed elsewhere): rank 0's 0.3 s
    # against a mean of 0.15 s is a 0.15 s straggler, plus ubatch 0's 0.
    evidence = _evidence([[0.1, 0.3], [0.1]])
    assert evidence["straggler_s"] == pytest.approx(0.15, abs=1e-12)
