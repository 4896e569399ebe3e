"""Evidence derived from synthetic span timelines (no processes)."""

import pytest

from pytest_afd.backends.cpu.afd.evidence import (
    ATTENTION,
    DISPATCH,
    FFN_IDLE,
    FINAL,
    ROUTED_MOE,
    SEND,
    WAIT,
    Span,
    Timeline,
    critical_path,
    load_stats,
    overlap_fraction,
    per_layer_table,
)

ATT, FFN = 0, 1


def _pipeline(expert_s):
    """One MoE layer, two ubatches, attention 2 s each, experts ``expert_s`` each."""
    a = [
        Span(ATT, ATTENTION, 1, 0, 0.0, 2.0),
        Span(ATT, DISPATCH, 1, 0, 2.0, 2.0, FFN),
        Span(ATT, ATTENTION, 1, 1, 2.0, 4.0),
        Span(ATT, DISPATCH, 1, 1, 4.0, 4.0, FFN),
    ]
    f0_end = 2.0 + expert_s
    f1_start = max(f0_end, 4.0)
    f1_end = f1_start + expert_s
    f = [
        Span(FFN, FFN_IDLE, 1, 0, 0.0, 2.0, ATT),
        Span(FFN, ROUTED_MOE, 1, 0, 2.0, f0_end),
        Span(FFN, SEND, 1, 0, f0_end, f0_end, ATT),
        Span(FFN, FFN_IDLE, 1, 1, f0_end, f1_start, ATT),
        Span(FFN, ROUTED_MOE, 1, 1, f1_start, f1_end),
        Span(FFN, SEND, 1, 1, f1_end, f1_end, ATT),
    ]
    wait0_end = max(4.0, f0_end)
    a += [
        Span(ATT, WAIT, 1, 0, 4.0, wait0_end, FFN),
        Span(ATT, WAIT, 1, 1, wait0_end, max(wait0_end, f1_end), FFN),
    ]
    end = max(wait0_end, f1_end)
    a.append(Span(ATT, FINAL, -1, -1, end, end + 0.5))
    return a, f


def test_overlap_fraction_of_a_two_stage_pipeline():
    attention, ffn = _pipeline(expert_s=2.0)
    # Experts of ubatch 0 ran entirely under ubatch 1's attention: 2 of the FFN's 4 s.
    assert overlap_fraction(attention, ffn) == pytest.approx(0.5)
    serial_attention = [Span(ATT, ATTENTION, 1, 0, 0.0, 2.0)]
    serial_ffn = [Span(FFN, ROUTED_MOE, 1, 0, 2.0, 4.0)]
    assert overlap_fraction(serial_attention, serial_ffn) == 0.0


def test_critical_path_follows_the_expert_side_when_it_is_slower():
    attention, ffn = _pipeline(expert_s=3.0)
    path = critical_path({ATT: attention, FFN: ffn})
    # attention(u0) 2 -> experts(u0) 3 -> experts(u1) 3 -> final 0.5
    assert path["critical_path_s"] == pytest.approx(8.5)
    assert path["critical_path_by_kind_s"][ROUTED_MOE] == pytest.approx(6.0)
    assert path["critical_path_by_kind_s"][ATTENTION] == pytest.approx(2.0)
    assert path["critical_path_rank_switches"] == 2


def test_critical_path_stays_on_attention_when_experts_hide():
    attention, ffn = _pipeline(expert_s=1.0)
    path = critical_path({ATT: attention, FFN: ffn})
    # attention 2 + 2, then ubatch 1's experts (1 s) end the MoE stage, then final.
    assert path["critical_path_s"] == pytest.approx(5.5)
    assert path["critical_path_by_kind_s"][ATTENTION] == pytest.approx(4.0)


def test_load_stats():
    stats = load_stats([2, 2, 2, 6])
    assert stats["max_over_mean"] == pytest.approx(2.0)
    assert stats["cv"] == pytest.approx(pytest.approx(1.7320508 / 3))
    assert load_stats([0, 0])["cv"] is None


def test_disabled_timeline_records_nothing_and_enabled_labels_spans():
    off = Timeline(False)
    with off.span(ATTENTION, 3, 1):
        pass
    off.add(FFN_IDLE, 1, 0, 0.0, 1.0)
    assert off.spans == []
    on = Timeline(True)
    with on.span(ATTENTION, 3, 1, 5):
        pass
    (kind, layer, ubatch, start, end, peer, cpu) = on.spans[0]
    assert (kind, layer, ubatch, peer) == (ATTENTION, 3, 1, 5) and end >= start and cpu >= 0


def test_per_layer_table_sums_by_layer_and_ubatch():
    attention, _ = _pipeline(expert_s=1.0)
    table = per_layer_table(attention)
    assert table[0] == {"layer": 1, "ubatch": 0, ATTENTION: 2.0, DISPATCH: 0.0, WAIT: 0.0}
