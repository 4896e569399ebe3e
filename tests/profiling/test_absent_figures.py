"""Unknown is absent with its reason, never 0 (issue 42), on role data built in memory."""

from __future__ import annotations

import pytest

from afd_split.ranges import parse_range
from pytest_afd.profiling import evidence, straggler
from pytest_afd.profiling.timebase import seconds, us_to_ns

GMM = "GroupedMatmul"
STEP_ROW = {"computing_ns": 100, "communication_not_overlapped_ns": 0, "overlapped_ns": 0,
            "communication_ns": 0, "free_ns": 50, "stage_ns": 150, "bubble_ns": 0}


def ffn(expert_ns: dict[int, list[int]], *, tag=None, op_type=GMM) -> evidence.RoleData:
    """FFN ranks whose expert kernels in step "1" last ``expert_ns[rank]`` each."""
    ranks = []
    for rank, durations in expert_ns.items():
        items = [evidence.WorkItem("1", f"{op_type}_{i}", op_type, 1000 * i, ns, tag)
                 for i, ns in enumerate(durations)]
        ranks.append(evidence.RankData(rank, items, {"1": dict(STEP_ROW)}))
    return evidence.RoleData("ffn", ranks)


def test_a_slow_rank_is_found_without_layer_ranges():
    role = ffn({0: [50_000, 50_000], 1: [70_000, 70_000]})
    figure = straggler.step_straggler(role, "1")
    assert figure["straggler_s"] == pytest.approx(20e-6)  # 140 - mean(100, 140)
    assert figure["slowest_rank"] == 1
    summary = straggler.summary(role, None)
    assert summary["total_s"] == pytest.approx(20e-6) and summary["slowest_rank"] == 1
    assert "no AFD layer range" in summary["per_layer"]["absent_reason"]


def test_equal_ranks_are_a_measured_zero():
    """The input says both ranks took 50 us: 0 is the figure, not an unknown."""
    assert straggler.step_straggler(ffn({0: [50_000], 1: [50_000]}), "1")["straggler_s"] == 0.0


def test_layer_ranges_split_the_same_time():
    tag = parse_range("afd|routed_moe|L3|U-")
    layers = straggler.summary(ffn({0: [10_000], 1: [30_000]}, tag=tag), None)["per_layer"]
    assert [(e["layer"], e["slowest_rank"]) for e in layers] == [(3, 1)]
    assert layers[0]["straggler_s"] == pytest.approx(10e-6)


@pytest.mark.parametrize(("role", "reason"), [
    (None, "no FFN-side profile"),
    (ffn({0: [50_000]}), "no other rank"),
    (ffn({0: [50_000], 1: [70_000]}, op_type="MatMulV2"), "no routed-expert kernel"),
])
def test_unknown_straggler_is_absent(role, reason):
    assert reason in straggler.step_straggler(role, "1")["absent_reason"]
    summary = straggler.summary(role, None)
    total = summary if role is None else summary["total_s"]
    assert total["value"] is None and reason in total["absent_reason"]


def attention(row: dict) -> evidence.RoleData:
    items = [evidence.WorkItem("1", "sfa", "SparseFlashAttention", 0, 100, None)]
    return evidence.RoleData("attention", [evidence.RankData(0, items, {"1": row})])


@pytest.mark.parametrize("missing", ["free_ns", "bubble_ns"])
def test_a_missing_step_trace_column_is_absent(missing):
    role = attention({**STEP_ROW, missing: None})
    (step,) = evidence.per_step({"attention": role})
    assert step["exposed_bubble_s"]["value"] is None
    assert evidence.busy_fraction(role)["value"] is None


def test_a_rank_without_its_step_row_is_absent():
    role = attention(dict(STEP_ROW))
    role.ranks[0].steps.clear()
    (step,) = evidence.per_step({"attention": role})
    assert "no step-trace row" in step["exposed_bubble_s"]["absent_reason"]
    assert step["critical_path_s"]["value"] is None


def test_collective_without_elapse_time_is_absent():
    record = {"group": "tp", "step": "1", "rank": 0, "num_ops": 1, "time_ns": None,
              "transit_time_ns": 0, "volume_mb": 0.0, "transports": {}}
    (group,) = evidence.collectives([evidence.RoleData("attention", [], [record])])
    assert group["time_s_per_step"]["value"] is None
    assert group["bandwidth_gb_s"]["value"] is None


def test_timestamps_parse_exactly_to_ns():
    assert us_to_ns("1777097775243356.820\t") == 1_777_097_775_243_356_820
    assert us_to_ns("1700000000123456.789") == 1_700_000_000_123_456_789
    # A float keeps ~0.1 us here; it is read through its repr, never its binary expansion.
    assert us_to_ns(1700000000123456.789) == 1_700_000_000_123_456_800
    assert seconds(1_500) == 1.5e-6
    with pytest.raises(ValueError, match="'12ab'"):
        us_to_ns("12ab", "kernel_details.csv line 3")


def test_the_printed_summary_says_absent_and_why():
    from pytest_afd.profiling.summary_text import render

    profile = evidence.build({"ffn": ffn({0: [50_000]})}, source="ascend_pt",
                             analyzer={"name": "msprof-analyze", "version": "26.2.0"})
    text = render(profile)
    assert "straggler absent |" in text
    assert "  straggler: one FFN rank: no other rank to straggle against" in text
    assert "straggler 0" not in text
