"""``pytest-afd bench``: lists and runs benchmarks by name, records a run with its date, load and
CPU time, and docs/benchmarks.md is exactly what the committed records render to."""

from __future__ import annotations

import json

import pytest

from pytest_afd.cli import main
from pytest_afd.cli.bench import DEFAULT_BENCHMARKS, DEFAULT_DOCS, RESULTS
from pytest_afd.cli.bench_docs import render_page

FIXTURE_BENCH = '''"""A fixture benchmark: one target, met unless --slow."""
import argparse, json
parser = argparse.ArgumentParser()
parser.add_argument("--slow", action="store_true")
parser.add_argument("--output")
args = parser.parse_args()
report = {"targets": [{"name": "tiny_us", "median_us": 9.0 if args.slow else 1.0, "max_us": 5.0,
                       "met": not args.slow}]}
open(args.output, "w").write(json.dumps(report))
print("tiny_bench: 1/1 targets met" if not args.slow else "tiny_bench: 0/1 targets met")
'''


def test_the_committed_page_is_what_the_committed_records_render_to():
    assert DEFAULT_DOCS.read_text() == render_page(DEFAULT_BENCHMARKS / RESULTS), (
        "docs/benchmarks.md is out of date: run 'pytest-afd bench --docs'")


def test_list_names_every_benchmark_with_its_docstring(capsys):
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for path in DEFAULT_BENCHMARKS.glob("*_bench.py"):
        assert path.name.removesuffix("_bench.py").replace("_", "-") in out
    assert "split " in out and "Split-path cost per forward step" in out


@pytest.fixture
def bench_dir(tmp_path):
    directory = tmp_path / "benchmarks"
    directory.mkdir()
    (directory / "tiny_thing_bench.py").write_text(FIXTURE_BENCH)
    return directory


def test_record_stores_date_load_cpu_and_the_result_and_the_page_shows_them(bench_dir, capsys):
    assert main(["bench", "--benchmarks-dir", str(bench_dir), "--record", "tiny-thing",
                 "--slow"]) == 0
    record = json.loads((bench_dir / RESULTS / "tiny-thing.json").read_text())
    assert record["command"] == "pytest-afd bench --record tiny-thing --slow"
    assert record["date"].endswith("Z") and len(record["load_before"]) == 3
    assert record["wall_s"] > 0 and record["cpu_user_s"] >= 0 and record["exit_status"] == 0
    assert record["summary"] == "tiny_bench: 0/1 targets met"
    assert record["result"]["targets"][0]["met"] is False
    page = render_page(bench_dir / RESULTS)
    assert f"- date: {record['date']}; load: {record['load_before'][0]} before" in page
    assert "| tiny_us | max_us=5, median_us=9 | NOT met |" in page


def test_docs_check_fails_on_a_stale_page_and_passes_on_a_fresh_one(bench_dir, tmp_path, capsys):
    page = tmp_path / "benchmarks.md"
    page.write_text("# edited by hand\n")
    arguments = ["bench", "--benchmarks-dir", str(bench_dir), "--docs-file", str(page), "--docs"]
    assert main([*arguments, "--check"]) == 1
    assert "is out of date" in capsys.readouterr().err
    assert main(arguments) == 0
    assert main([*arguments, "--check"]) == 0
    assert "No run recorded yet." in page.read_text()


def test_hand_recorded_figures_render_as_a_dated_table(tmp_path):
    (tmp_path / "history.json").write_text(json.dumps({
        "kind": "hand-recorded", "title": "Suite", "source": "by hand",
        "entries": [{"date": "2026-12-03", "command": "pytest -m gate", "where": "here",
                     "time": "42 s", "cpu": "41 s", "load": "0.8", "note": "a|b"}]}))
    page = render_page(tmp_path)
    assert "| 2026-12-03 | pytest -m gate | here | 42 s | 41 s | 0.8 | a\\|b |" in page


@pytest.mark.parametrize("targets", [
    [{"name": "fewer", "ratio": 2.5, "met": True}, {"name": "same", "ratio": 0.8, "met": False}],
    {"fewer": {"ratio": 2.5, "met": True}, "same": {"ratio": 0.8, "met": False}},
])
def test_targets_render_as_a_list_or_as_a_mapping_of_names(tmp_path, targets):
    """sequential_stage_bench writes ``{name: figures}``; the page once failed on it."""
    (tmp_path / "x.json").write_text(json.dumps({
        "benchmark": "x", "command": "c", "date": "d", "load_before": [0.5], "load_after": [1.0],
        "cpus": 2, "wall_s": 1, "cpu_user_s": 1, "cpu_system_s": 0, "exit_status": 0,
        "summary": "s", "result": {"targets": targets}}))
    page = render_page(tmp_path)
    assert "| fewer | ratio=2.5 | met |" in page and "| same | ratio=0.8 | NOT met |" in page


def test_a_broken_record_is_named(tmp_path):
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match=r"bad\.json: not JSON"):
        render_page(tmp_path)


def test_an_unknown_benchmark_is_refused_with_the_choices(bench_dir, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--benchmarks-dir", str(bench_dir), "tiny"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "no benchmark 'tiny'" in err and "(choose from tiny-thing)" in err


def test_running_by_name_passes_the_arguments_and_returns_the_status(bench_dir, tmp_path, capfd):
    output = tmp_path / "out.json"
    assert main(["bench", "--benchmarks-dir", str(bench_dir), "tiny-thing", "--output",
                 str(output)]) == 0
    assert json.loads(output.read_text())["targets"][0]["met"] is True
    assert "tiny_bench: 1/1 targets met" in capfd.readouterr().out
