"""split_bench runs end to end: every target with a met flag, the round protocol recorded,
and the baselines checked against the planners (no timing asserted)."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "split_bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("split_bench_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_report_has_every_target_and_the_protocol(bench, tmp_path, capsys):
    out = tmp_path / "split.json"
    assert bench.main(["--sizes", "1,8,512", "--samples", "2", "--passes", "2", "--repeats", "0",
                       "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    names = {entry["name"] for entry in report["targets"]}
    assert names == {"planning_us_1", "planning_us_8", "request_check_us_512", "validate_split_us_512"}
    assert isinstance(report["load_ok"], bool) and len(report["load_attempts"]) == 1
    assert set(report["context"]["planning_vs_plain_python"]) == {"1", "8", "512"}
    assert all(isinstance(entry["met"], bool) for entry in report["targets"])
    assert "2 rounds x 2 shuffled passes" in report["protocol"]
    timing = report["results"][0]["timings"]["plan_token_balanced"]
    assert timing["rounds"] == 2 and timing["all_samples"]["samples"] == 4
    assert timing["p10_us"] <= timing["median_us"] <= timing["p90_us"]
    assert set(report["context"]["planning_vs_planner_with_slices"]) == {"1", "8", "512"}
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("split_bench: ")
    # The text output is labelled with its unit (it once printed a bare dict of microseconds).
    assert lines[0].startswith("median thread CPU time per call, microseconds (us)")
    assert " us" in lines[1] and "{" not in lines[1]


def test_round_keeps_each_callables_fastest_pass(bench):
    rounds, _calls, every = bench.time_interleaved({"f": lambda: sum(range(50))}, 3, 0, 4)
    assert rounds["f"].shape == (3,) and every["f"].shape == (12,)
    for index in range(3):
        assert rounds["f"][index] == every["f"][4 * index : 4 * index + 4].min()


def test_the_slices_baseline_returns_the_plugins_slices(bench):
    tokens = np.array([40, 7, 90, 3], dtype=np.int64)
    head, tail = bench.baseline_planner_with_slices(tokens)
    cut = bench.baseline_request_boundary(tokens.tolist())
    assert head.token_slice == slice(0, cut) and tail.token_slice == slice(cut, 140)
    assert head.request_slice.stop == tail.request_slice.start == 2
    assert bench.baseline_planner_with_slices(np.array([5], dtype=np.int64)) is None
