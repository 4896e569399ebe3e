"""The Markdown + PNG report, from result documents built and validated by pytest_afd.results.documents."""

import json
import subprocess
import sys

import pytest
from matplotlib import image as mpimg

from pytest_afd import report
from pytest_afd.__main__ import main
from pytest_afd.results import documents as results
from pytest_afd.results.manifest import stack_digest
from pytest_afd.scheduling import SchedulerConfig, schedule
from pytest_afd.workloads import make_workload
from tests.support.report_builders import NUM_LAYERS, SMALL, make_manifest, make_result, write


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """One results directory covering stages A, B, D and E, rendered once."""
    directory = tmp_path_factory.mktemp("results")
    balanced = make_workload("uniform", **SMALL)
    long_short = make_workload("long_short", **SMALL)
    walls = {"none": 2.0, "request_boundary": 1.6, "token_balanced": 1.0}
    for workload in (balanced, long_short):
        for policy, wall in walls.items():
            write(
                directory,
                make_result(
                    f"stage_a/{workload.name}/{policy}", "stage_a", workload, policy, wall_s=wall
                ),
            )
    for ratio in (0.0, 0.25, 0.5):
        workload = make_workload("uniform", requested_hit_ratio=ratio, **SMALL)
        write(
            directory,
            make_result(f"stage_b/{workload.name}", "stage_b", workload, "token_balanced"),
        )
    for chunk, wall in ((64, 1.5), (128, 1.2), (100, None)):
        plan = schedule(
            list(balanced.prompt_lengths), config=SchedulerConfig(chunk_size=chunk, page_size=16)
        )
        write(
            directory,
            make_result(
                f"stage_d/chunk{chunk}",
                "stage_d",
                balanced,
                "token_balanced",
                wall_s=wall or 1.0,
                chunk_size=chunk,
                chunk_plan=plan.to_json(),
            ),
        )
    write(directory, make_result("stage_d/unchunked", "stage_d", balanced, "token_balanced"))
    timings = {
        "layers": [{"attention_s": 0.01 * (i + 1), "moe_s": 0.02} for i in range(NUM_LAYERS)]
    }
    for routing, skewed in (("natural", True), ("forced_balanced", False)):
        write(
            directory,
            make_result(
                f"stage_e/{routing}",
                "stage_e",
                long_short,
                "token_balanced",
                routing=routing,
                skewed=skewed,
                timings=timings,
            ),
        )
    path = report.render(directory)
    return directory, path, path.read_text()


def _section(text, stage):
    start = text.index(f"## {stage}:")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def test_report_has_one_table_per_stage_with_every_case(rendered):
    directory, path, text = rendered
    assert path == directory / "report" / "report.md"
    for stage in ("stage_a", "stage_b", "stage_d", "stage_e"):
        section = _section(text, stage)
        # Stage E's routings are per-case run keys: natural and forced share one stack's table.
        assert section.count("| case | verdict | workload | policy |") == 1, stage
    assert "## stage_c" not in text
    for result_file in directory.glob("*.json"):
        case_id = json.loads(result_file.read_text())["case_id"]
        stage, _, short = case_id.partition("/")  # the table drops the shared "stage_x/"
        assert f"| {short} |" in _section(text, stage)
        assert f"Case ids below follow `{stage}/`." in _section(text, stage)
    assert "1 stacks" not in text
    for stage in ("stage_a", "stage_b", "stage_d", "stage_e"):
        assert "different stacks" not in _section(text, stage)


def test_table_values_come_from_the_results(rendered):
    _, _, text = rendered
    row = next(
        line
        for line in text.splitlines()
        if line.startswith("| long_short-fixed/request_boundary |")
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    tokens = 512  # long_short total after scaling: 16384 / 32
    assert cells[1] == "unknown"  # built without an outcome: a legacy result
    assert cells[5].startswith(f"{tokens / (1.6 * 1.1):.4g} ")  # median of 3 reps
    assert "n=3" in cells[5]
    # The request-boundary cut on one long + seven short requests.
    lengths = make_workload("long_short", **SMALL).prompt_lengths
    expected = abs(2 * lengths[0] - sum(lengths)) / sum(lengths)
    assert cells[11] == f"{tokens} / {tokens} / 0"
    assert cells[12] == f"{expected * 100:.1f}% / {expected * 100:.1f}%"
    none_row = next(
        line for line in text.splitlines() if line.startswith("| long_short-fixed/none |")
    )
    assert "— / —" in none_row  # no split: no imbalance


def test_workload_statistics_are_listed_once_per_dataset(rendered):
    _, _, text = rendered
    section = _section(text, "stage_a")
    workload = make_workload("long_short", **SMALL)
    (row,) = [line for line in section.splitlines() if line.startswith("| long_short-fixed | `")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    stats = workload.stats
    assert cells[1] == f"`{workload.content_hash[:12]}`"
    assert cells[2:5] == ["8", str(stats.total), f"{stats.mean:.5g}"]
    assert cells[8] == f"{stats.cv:.5g}"
    assert cells[-2:] == ["all_at_once", "—"]  # arrival; no warm-cache column without a prefix


def test_hit_ratio_rank_skew_and_labels(rendered):
    _, _, text = rendered
    hit_row = next(line for line in text.splitlines() if line.startswith("| uniform-fixed-hit50 |"))
    assert "50.0% / 50.0%" in hit_row
    natural = next(line for line in text.splitlines() if line.startswith("| natural |"))
    forced = next(
        line for line in text.splitlines() if line.startswith("| forced_balanced |")
    )
    assert "| 2 |" in natural  # rank 0: 60 of 120 tokens over 4 ranks -> max/mean = 2
    assert "| 1 |" in forced and "synthetic" in forced and "synthetic" not in natural


def test_invalid_chunk_size_is_marked_with_its_reason(rendered):
    _, _, text = rendered
    invalid = next(line for line in text.splitlines() if line.startswith("| chunk100 |"))
    assert "invalid chunk size:" in invalid and "100" in invalid
    valid = next(line for line in text.splitlines() if line.startswith("| chunk128 |"))
    assert "invalid" not in valid
    assert "chunk_sweep.png" in _section(text, "stage_d")


COMMON_PLOTS = ("policy_metrics", "imbalance_vs_step_time", "expert_heat", "rank_skew")


@pytest.mark.parametrize(
    ("stage", "plots"),
    [
        ("stage_a", COMMON_PLOTS),
        ("stage_b", (*COMMON_PLOTS, "hit_ratio")),  # a sweep of requested ratios
        ("stage_d", (*COMMON_PLOTS, "chunk_sweep")),  # several chunk sizes
        ("stage_e", (*COMMON_PLOTS, "layer_breakdown")),  # the only instrumented cases
    ],
)
def test_plots_are_linked_and_open_as_images(rendered, stage, plots):
    _, path, text = rendered
    section = _section(text, stage)
    linked = [
        line[line.index("](") + 2 : -1] for line in section.splitlines() if line.startswith("![")
    ]
    names = sorted({link.rsplit("-", 1)[1].removesuffix(".png") for link in linked})
    assert names == sorted(plots)
    for link in linked:
        pixels = mpimg.imread(path.parent / link)
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
        assert pixels.std() > 0.01, f"{link} is blank"


def test_step_time_is_derived_from_throughput_and_steps():
    workload = make_workload("bimodal", **SMALL)
    doc = make_result("x", "stage_a", workload, "token_balanced", wall_s=2.0)
    median_wall = 2.0 * 1.1
    assert report.step_time_s(doc) == pytest.approx(median_wall / 1)
    for step, seconds in zip(doc["evidence"]["steps"], [0.25], strict=True):
        step["wall_time_s"] = seconds
    assert report.step_time_s(doc) == pytest.approx(0.25)
    doc["metrics"]["step_time_s"] = results.measurement([0.5, 0.7, 0.6], "s")
    assert report.step_time_s(doc) == pytest.approx(0.6)


def test_stacks_are_never_mixed(tmp_path):
    workload = make_workload("bimodal", **SMALL)
    reduced, full = make_manifest(num_layers=3), make_manifest(num_layers=61)
    assert reduced["digest"] != full["digest"]
    for policy in ("request_boundary", "token_balanced"):
        for name, manifest in (("reduced", reduced), ("full", full)):
            write(
                tmp_path,
                make_result(
                    f"stage_a/{name}/{policy}", "stage_a", workload, policy, manifest=manifest
                ),
            )
    text = report.render(tmp_path).read_text()
    assert "2 different stacks" in text
    # A stack is its manifest without the per-case run keys (manifest.stack_digest).
    digests = {
        doc["case_id"].split("/")[1]: stack_digest(doc["manifest"])
        for doc in (json.loads(f.read_text()) for f in tmp_path.glob("*.json"))
    }
    headings = [line for line in text.splitlines() if line.startswith("### Stack")]
    assert sorted(headings) == sorted(
        f"### Stack `{report.short_digest(digests[name])}`: reduced/{layers}L dp3pcp8-ep8"
        for name, layers in (("reduced", 3), ("full", 61))
    )
    assert "3 layers" in text and "61 layers" in text
    for name in ("reduced", "full"):
        start = text.index(f"### Stack `{report.short_digest(digests[name])}`")
        end = text.find("### Stack", start + 1)
        block = text[start : end if end >= 0 else len(text)]
        rows = [
            line.split("|")[1].strip()
            for line in block.splitlines()
            if line.startswith(("| request_boundary |", "| token_balanced |"))
        ]
        assert sorted(rows) == ["request_boundary", "token_balanced"]
        assert f"Case ids below follow `stage_a/{name}/`." in block
    plots = sorted(p.name for p in (tmp_path / "report" / "plots").glob("*policy_metrics.png"))
    assert len(plots) == 2


def test_a_case_without_measurements_shows_why(tmp_path):
    workload = make_workload("uniform", **SMALL)
    doc = make_result("stage_b/hit95", "stage_b", workload, "token_balanced")
    doc["metrics"]["prefill_tokens_per_s"] = results.absent("omitted, not measured: not realizable")
    write(tmp_path, doc)
    text = report.render(tmp_path).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| stage_b/hit95 |"))
    assert row.endswith("| omitted, not measured: not realizable |")


def test_bad_and_foreign_files_are_listed_not_fatal(tmp_path):
    workload = make_workload("uniform", **SMALL)
    doc = make_result("stage_c/ok", "stage_c", workload, "token_balanced")
    write(tmp_path, doc)
    (tmp_path / "torn.json").write_text("{not json")
    (tmp_path / "summary.json").write_text(json.dumps({"kind": "session-summary"}))
    broken = json.loads(json.dumps(doc))
    broken["case_id"] = "stage_c/broken"
    del broken["metrics"]["ttft_s"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    text = report.render(tmp_path).read_text()
    skipped = text[text.index("## Skipped files") :]
    assert "`torn.json` | unreadable JSON" in skipped
    assert "summary.json" not in skipped
    assert "Other JSON files (not results, not read): `summary.json`." in text
    assert "`broken.json` | result 'stage_c/broken' does not match" in skipped
    assert "/metrics" in skipped and "ttft_s" in skipped
    assert "| stage_c/ok |" in text and "| stage_c/broken |" not in text


def test_empty_directory_and_cli(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 0
    written = capsys.readouterr().out.strip()
    assert written == str(tmp_path / "report" / "report.md")
    assert "No result documents were found." in (tmp_path / "report" / "report.md").read_text()
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err


def test_python_dash_m_entry_point(tmp_path):
    workload = make_workload("uniform", **SMALL)
    write(tmp_path, make_result("stage_a/u/token_balanced", "stage_a", workload, "token_balanced"))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest_afd",
            "report",
            str(tmp_path),
            "--output",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == str(tmp_path / "out" / "report.md")
    assert "| stage_a/u/token_balanced |" in (tmp_path / "out" / "report.md").read_text()
    assert list((tmp_path / "out" / "plots").glob("*.png"))


def test_policy_comparison_table_gives_the_proposed_over_control_ratio(rendered):
    _, _, text = rendered
    section = _section(text, "stage_a")
    table = section[section.index("Median prefill tokens/s per policy:") :]
    header = next(line for line in table.splitlines() if line.startswith("| condition |"))
    assert header.endswith("| token_balanced / request_boundary |")
    row = next(line for line in table.splitlines() if line.startswith("| long_short-fixed |"))
    # walls 1.6 s vs 1.0 s, same tokens: x1.6 is inside the between-session floor (x2)
    assert row.endswith("| 1.6 (inside the noise) |")


def test_condition_labels_separate_phases_and_keep_policies_together():
    workload = make_workload("uniform", requested_hit_ratio=0.5, **SMALL)
    loaded = [
        report.LoadedResult(
            path=None, doc=make_result(f"stage_b/{phase}/{policy}", "stage_b", workload, policy)
        )
        for phase in ("cold", "steady")
        for policy in ("request_boundary", "token_balanced")
    ]
    labels = report.condition_labels(loaded)
    assert labels == {
        "stage_b/cold/request_boundary": "uniform-fixed-hit50 cold",
        "stage_b/cold/token_balanced": "uniform-fixed-hit50 cold",
        "stage_b/steady/request_boundary": "uniform-fixed-hit50 steady",
        "stage_b/steady/token_balanced": "uniform-fixed-hit50 steady",
    }
    chunked = make_result("stage_d/c64", "stage_d", workload, "token_balanced", chunk_size=64)
    plain = make_result("stage_d/none", "stage_d", workload, "token_balanced")
    labels = report.condition_labels(
        [report.LoadedResult(path=None, doc=d) for d in (chunked, plain)]
    )
    assert labels == {
        "stage_d/c64": "uniform-fixed-hit50 chunk 64",
        "stage_d/none": "uniform-fixed-hit50 chunk unchunked",
    }


def test_layer_breakdown_from_afd_runtime_tables():
    tables = {
        "attention": [
            {"layer": 0, "ubatch": 0, "attention": 0.25, "wait": 0.5},
            {"layer": 0, "ubatch": 1, "attention": 0.25},
            {"layer": 2, "ubatch": 0, "attention": 1.0},
        ],
        "ffn": [{"layer": 0, "ubatch": 0, "routed_moe": 2.0}],
    }
    assert report.layer_breakdown_from_tables(tables) == {
        "layers": [
            {"attention/attention": 0.5, "attention/wait": 0.5, "ffn/routed_moe": 2.0},
            {},
            {"attention/attention": 1.0},
        ]
    }
    assert report.layer_breakdown_from_tables({}) == {"layers": []}


def test_per_layer_rank_skew():
    workload = make_workload("uniform", **SMALL)
    skewed = make_result("e/n", "stage_e", workload, "token_balanced", skewed=True)
    assert report.per_layer_rank_skew(skewed) == [2.0] * NUM_LAYERS
    balanced = make_result("e/f", "stage_e", workload, "token_balanced", routing="forced_balanced")
    assert report.per_layer_rank_skew(balanced) == [1.0] * NUM_LAYERS
    balanced["evidence"]["expert_load"] = results.absent("no load")
    assert report.per_layer_rank_skew(balanced) is None
    assert report.rank_skew(balanced) is None


def test_condition_labels_use_the_recorded_cache_phase():
    workload = make_workload("uniform", requested_hit_ratio=0.5, **SMALL)
    docs = []
    for phase in ("cold", "steady"):
        doc = make_result(f"stage_b/{phase}", "stage_b", workload, "token_balanced")
        doc["settings"]["prefix_cache"]["phase"] = phase
        docs.append(report.LoadedResult(path=None, doc=doc))
    assert report.condition_labels(docs) == {
        "stage_b/cold": "uniform-fixed-hit50 cold",
        "stage_b/steady": "uniform-fixed-hit50 steady",
    }


def test_condition_labels_never_show_a_test_id():
    """Two parametrisations with one condition: told apart by their parameters, not node ids."""
    workload = make_workload("uniform", **SMALL)
    node = "suites/gates/test_gate_1.py::test_gate_1_token_balanced_matches_unsplit"
    ids = [f"{node}[dp3pcp8-ep8-none-equal]", f"{node}[dp4pcp8-none-equal]"]
    loaded = [
        report.LoadedResult(path=None, doc=make_result(i, "gate", workload, "token_balanced"))
        for i in ids
    ]
    labels = report.condition_labels(loaded)
    assert labels == {ids[0]: "uniform-fixed dp3pcp8 ep8", ids[1]: "uniform-fixed dp4pcp8"}
    sizes = [
        f"s/test_stage_a.py::test_stage_a_policy_matrix[{size}]/uniform/{policy}"
        for size in ("smallest", "stage")
        for policy in ("none", "token_balanced")
    ]
    loaded = [
        report.LoadedResult(path=None, doc=make_result(i, "stage_a", workload, i.rsplit("/")[-1]))
        for i in sizes
    ]
    labels = report.condition_labels(loaded)
    assert sorted(set(labels.values())) == ["uniform-fixed smallest", "uniform-fixed stage"]
    assert not any("test_" in label or "::" in label for label in labels.values())
