"""Captions say what a plot leaves out; numbered imbalance points have a key; tails that repeat p50."""

from pytest_afd import report
from pytest_afd.workloads import make_workload
from tests.support.report_builders import NUM_LAYERS, SMALL, make_result, write

TIMINGS = {"layers": [{"attention_s": 0.01, "moe_s": 0.02} for _ in range(NUM_LAYERS)]}


def _all_at_once(doc):
    """Every request's first token from one prefill: the TTFT percentiles are all p50."""
    for key in ("p90", "p95", "p99"):
        doc["metrics"]["ttft_s"][key] = doc["metrics"]["ttft_s"]["p50"]
    return doc


def test_captions_name_what_is_left_out_and_the_key_matches_the_points(tmp_path):
    workload = make_workload("uniform", **SMALL)
    for index, policy in enumerate(("request_boundary", "token_balanced")):
        for case in range(3):
            doc = make_result(f"stage_c/c{case}/{policy}", "stage_c", workload, policy,
                              wall_s=1.0 + 0.1 * index + 0.05 * case,
                              timings=TIMINGS if case == 0 else None)
            write(tmp_path, _all_at_once(doc))
    text = report.render(tmp_path).read_text()
    assert "; 2 of 2 instrumented case(s) of 6 in this stack." in text  # layer breakdown
    assert "TTFT p99 not drawn: it equals p50 in every case (all requests arrive at once" in text
    row = next(line for line in text.splitlines() if line.startswith("| c0/request_boundary |"))
    assert "| = p50 (all_at_once) |" in row
    key = text[text.index("Key to the numbered points:") :]
    rows = [line for line in key.splitlines()[2:] if line.startswith("| ")][1:]
    assert [row.split("|")[1].strip() for row in rows] == [str(n) for n in range(1, 7)]
    assert any("key outlier" in row for row in rows)


def test_the_policy_plot_caps_its_rows_and_says_so():
    from pytest_afd.report.plots import (
        MAX_CONDITIONS_SHOWN,
        draw_policy_metrics,
        metric_panels,
        plot_note,
    )

    workload = make_workload("uniform", **SMALL)
    base = make_result("stage_a/m/p0/token_balanced", "stage_a", workload, "token_balanced")
    many = [report.LoadedResult(None, {**base, "case_id": f"stage_a/m/p{i}/token_balanced"})
            for i in range(MAX_CONDITIONS_SHOWN + 30)]
    figure = draw_policy_metrics(many)
    panels = len(metric_panels(many))
    rows = sum(len(axis.get_yticks()) for axis in figure.axes[::panels])
    assert rows == MAX_CONDITIONS_SHOWN
    assert figure.get_figheight() * figure.dpi < 10_000  # not 68,400 px for thousands of cases
    assert f"the first {MAX_CONDITIONS_SHOWN} of {MAX_CONDITIONS_SHOWN + 30} conditions" in (
        plot_note("policy_metrics", many))
