"""Plots stay readable from 1 to 100+ cases: checked on the drawn figures' text extents.

layout_check.layout_problems judges a figure after drawing: no two tick
labels, titles, annotations or legends overlap, nothing is cut off, legends
stay off the data, and every axes keeps a minimum size. The check itself is
shown to fail on a crammed figure like the old Stage D plot (rotated node-id
tick labels under three squashed panels).
"""

import functools

import pytest
from matplotlib.figure import Figure

from pytest_afd.report import LoadedResult
from pytest_afd.report.plots import PLOTTERS, draw_chunk_sweep, draw_policy_metrics
from pytest_afd.report.point_plots import imbalance_key, imbalance_points, key_outliers
from pytest_afd.report.sidebyside import draw_side_by_side
from pytest_afd.report.values import mean_imbalance
from pytest_afd.results import documents as results
from pytest_afd.workloads import make_workload
from tests.support.layout_check import layout_problems
from tests.support.report_builders import SMALL, make_manifest, make_result

STAGE_D_NODE = "suites/stage_d/test_stage_d_chunking.py::test_stage_d_chunk_sweep_then_best_two"
POLICIES = ("none", "request_boundary", "token_balanced")


def _loaded(docs):
    return [LoadedResult(path=None, doc=doc) for doc in docs]


def stage_d_like():
    """Today's Stage D shape: a 5-size sweep, then 3 sizes for 4 workloads (17 cases)."""
    docs = []
    for chunk in (128, 256, 512, 1024, None):
        workload = make_workload("bimodal", **SMALL)
        docs.append(
            make_result(
                f"{STAGE_D_NODE}/sweep/{workload.name}/chunk{chunk}",
                "stage_d",
                workload,
                "token_balanced",
                chunk_size=chunk,
            )
        )
    for name in ("long_short", "uniform"):
        for hit in (0.0, 0.75):
            workload = make_workload(name, requested_hit_ratio=hit, **SMALL)
            for chunk in (512, 1024, None):
                docs.append(
                    make_result(
                        f"{STAGE_D_NODE}/best/{workload.name}/chunk{chunk}",
                        "stage_d",
                        workload,
                        "token_balanced",
                        chunk_size=chunk,
                        wall_s=1.0 + hit,
                    )
                )
    return _loaded(docs)


@functools.cache
def many_cases():
    """120 cases: 2 parametrised sizes x 4 workloads x 5 chunk sizes x 3 policies.

    Built once per module (120 results take a second): every test only reads them.
    """
    docs = []
    node = "suites/stage_a/test_stage_a_policies.py::test_stage_a_policy_matrix"
    for size in ("smallest", "stage"):
        for name in ("bimodal", "heavy_tailed", "long_short", "uniform"):
            workload = make_workload(name, **SMALL)
            for chunk in (64, 128, 256, 512, None):
                for index, policy in enumerate(POLICIES):
                    docs.append(
                        make_result(
                            f"{node}[{size}]/{name}/chunk{chunk}/{policy}",
                            "stage_a",
                            workload,
                            policy,
                            chunk_size=chunk,
                            wall_s=1.0 + 0.1 * index,
                            skewed=index % 2 == 0,
                        )
                    )
    assert len(docs) == 120
    return _loaded(docs)


def one_case():
    workload = make_workload("uniform", **SMALL)
    return _loaded(
        [make_result("stage_a/only/token_balanced", "stage_a", workload, "token_balanced")]
    )


def two_models():
    """Gate-like expert load from a 3-layer and a 61-layer model: series must differ by name."""
    workload = make_workload("uniform", **SMALL)
    docs = []
    for layers in (3, 61):
        doc = make_result(
            f"gate4/{layers}", "gate", workload, "token_balanced", manifest=make_manifest(layers)
        )
        load = doc["evidence"]["expert_load"]
        load["per_expert"] = [load["per_expert"][0]] * layers
        load["per_rank"] = [load["per_rank"][0]] * layers
        doc["manifest"]["model"]["name"] = "full" if layers == 61 else "reduced"
        docs.append(doc)
    return _loaded(docs)


def prefix_hits():
    """Stage B's shape: 4 requested ratios x cold/steady x 2 policies; cold runs realize 0 %."""
    docs = []
    node = "suites/stage_b/test_stage_b_prefix_cache.py::test_stage_b_hit_ratio_sweep"
    for hit in (0.0, 0.25, 0.5, 0.75):
        workload = make_workload("uniform", requested_hit_ratio=hit, **SMALL)
        for phase in ("cold", "steady"):
            for index, policy in enumerate(POLICIES[1:]):
                doc = make_result(f"{node}/hit{hit}/{phase}/{policy}", "stage_b", workload,
                                  policy, wall_s=1.0 + 0.2 * index - 0.3 * hit)
                doc["settings"]["prefix_cache"]["phase"] = phase
                if phase == "cold":
                    doc["evidence"]["prefix_cache"]["realized_hit_ratio"] = 0.0
                docs.append(doc)
    return _loaded(docs)


CASE_SETS = {
    "prefix_hits": prefix_hits,
    "stage_d_like": stage_d_like,
    "many_cases": many_cases,
    "one_case": one_case,
    "two_models": two_models,
}


@pytest.fixture(scope="module", params=sorted(CASE_SETS))
def case_set(request):
    return request.param, CASE_SETS[request.param]()


def test_every_plot_reads_well(case_set):
    name, loaded = case_set
    drawn = []
    for plot_name, _, draw in PLOTTERS:
        figure = draw(loaded)
        if figure is None:
            continue
        drawn.append(plot_name)
        assert layout_problems(figure) == [], f"{name}: {plot_name}"
    assert "rank_skew" in drawn and "expert_heat" in drawn, drawn
    if name != "two_models":
        assert "policy_metrics" in drawn and "imbalance_vs_step_time" in drawn, drawn
    if name == "prefix_hits":
        assert "hit_ratio" in drawn, drawn


@pytest.fixture(scope="module")
def imbalance_figure():
    """The 120 cases' imbalance plot, drawn once: the tests below only read its texts."""
    return dict((n, d) for n, _, d in PLOTTERS)["imbalance_vs_step_time"](many_cases())


def test_point_labels_are_kept_only_where_they_fit(imbalance_figure):
    loaded = many_cases()
    figure = imbalance_figure
    (axis,) = figure.axes
    labels = [text for text in axis.texts if text.get_text()]
    points = sum(mean_imbalance(r.doc) is not None for r in loaded)
    assert points == 80  # the split cases; "none" has no imbalance
    assert 0 < len(labels) < points  # some labelled, the colliding ones left out
    assert layout_problems(figure) == []


def test_side_by_side_with_a_hundred_rows():
    workload = make_workload("uniform", **SMALL)
    docs = [make_result(f"c/{i}", "stage_a", workload, "token_balanced") for i in range(2)]
    rows = [(f"case {i} uniform-fixed chunk {64 * i}", docs[0], docs[1]) for i in range(100)]
    figure = draw_side_by_side(rows, ("A", "B"), "A vs B: 100 shared cases")
    assert layout_problems(figure) == []
    assert figure.get_figheight() > 100 * 0.3  # grows with the rows instead of squeezing them


def test_series_are_named_by_what_differs():
    figure = dict((n, d) for n, _, d in PLOTTERS)["rank_skew"](two_models())
    labels = figure.legends[0].get_texts()
    names = sorted(text.get_text() for text in labels)
    assert names == [
        "natural, full, 61 MoE layers, 1 case(s)",
        "natural, reduced, 3 MoE layers, 1 case(s)",
    ]


def test_no_plot_without_data():
    workload = make_workload("uniform", **SMALL)
    docs = []
    for chunk in (64, None):
        doc = make_result(f"gate/{chunk}", "gate", workload, "token_balanced", chunk_size=chunk)
        gone = results.absent("a gate measures no throughput")
        doc["metrics"]["prefill_tokens_per_s"] = gone
        doc["metrics"]["ttft_s"] = gone
        docs.append(doc)
    assert draw_chunk_sweep(_loaded(docs)) is None  # two sizes, nothing measured
    assert draw_policy_metrics(_loaded(docs)) is None


@pytest.mark.filterwarnings("ignore:constrained_layout not applied:UserWarning")
def test_the_check_catches_a_crammed_figure():
    """The old Stage D layout: three tiny panels under long rotated tick labels."""
    figure = Figure(figsize=(13.5, 3.5), dpi=100, layout="constrained")
    for index in range(3):
        axis = figure.add_subplot(1, 3, index + 1)
        labels = [f"{STAGE_D_NODE}/best/long_short-fixed-hit75/chunk{i}" for i in range(17)]
        axis.bar(range(17), range(17), label="token_balanced")
        axis.set_xticks(range(17))
        axis.set_xticklabels(labels, rotation=30, ha="right")
        axis.legend()
    problems = layout_problems(figure)
    assert any("overlaps" in p and "tick" in p for p in problems)
    assert any("legend" in p and "covers the data" in p for p in problems)
    tiny = Figure(figsize=(1.2, 1.0), dpi=100)
    tiny.add_subplot(1, 1, 1).plot([0, 1], [0, 1])
    assert any(p.startswith("axes ") and " x " in p for p in layout_problems(tiny))


def test_imbalance_points_are_numbered_and_key_outliers_labelled_in_full(imbalance_figure):
    loaded = many_cases()
    figure = imbalance_figure
    (axis,) = figure.axes
    texts = [text.get_text() for text in axis.texts]
    points = imbalance_points(loaded)
    outliers = key_outliers(points)
    assert 1 <= len(outliers) <= 3
    full = {int(t.split(":")[0]) for t in texts if ":" in t}
    numbers = {int(t) for t in texts if t.isdigit()}
    assert full and full <= set(outliers)  # outliers placed first, in full where they fit
    assert set(outliers) <= full | numbers  # else by their number
    assert numbers and numbers <= {n for n, *_ in points}  # every number names a key row
    key = imbalance_key(loaded)
    assert [row[0] for row in key] == [str(n) for n, *_ in points]
    assert sum(row[5] == "key outlier" for row in key) == len(outliers)


def test_hit_ratio_tells_cold_from_steady_and_labels_what_was_realized():
    figure = dict((n, d) for n, _, d in PLOTTERS)["hit_ratio"](prefix_hits())
    legend = sorted(text.get_text() for text in figure.legends[0].get_texts())
    assert "token_balanced, cold" in legend and "token_balanced, steady" in legend
    ratio_axis = figure.axes[0]
    labels = [text.get_text() for text in ratio_axis.texts]
    assert labels and all(label == "realized 0% (cold)" for label in labels)
    assert layout_problems(figure) == []
