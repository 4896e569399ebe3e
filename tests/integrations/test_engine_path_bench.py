"""engine_path_bench runs end to end and reports every target with a met flag (no timing asserted)."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from afd_split import plan_split

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH_DIR))
    try:
        spec = importlib.util.spec_from_file_location("engine_path_bench_under_test",
                                                      BENCH_DIR / "engine_path_bench.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH_DIR))


def test_report_has_both_targets_with_ratios_and_load(bench, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert bench.main(["--samples", "2", "--calls", "1", "--sizes", "8", "512",
                       "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [t["name"] for t in report["targets"]] == ["engine_path_8_requests",
                                                      "engine_path_512_requests"]
    assert all(isinstance(t["met"], bool) and t["ratio_to_plugin_style_median"] > 0
               for t in report["targets"])
    assert len(report["load_average_before"]) == 3
    assert capsys.readouterr().out.startswith("engine_path_bench [")
    for row in report["sizes"]:
        # The floor of the breakdown replays exactly the adapter's device ops.
        assert row["floor_matches_adapter_ops"], row["adapter_aten_ops"]
        assert set(row["breakdown_thread_cpu_us"]) == {
            "engine_plan_only", "adapter_split", "request_check", "torch_ops_floor"}


@pytest.mark.parametrize("seed", range(5))
def test_plugin_style_search_picks_the_request_boundary_policys_cut(bench, seed):
    lengths = np.random.default_rng(seed).integers(1, 5000, 40)
    head, tail = bench.plugin_style_request_boundary(lengths)
    plan = plan_split(lengths, policy="request_boundary")
    assert head[1].stop == tail[1].start == plan.split_token
    assert head[0].stop == plan.ubatches[1].request_slice.start
