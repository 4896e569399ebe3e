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


def test_report_has_every_target_with_ratios_and_load(bench, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert bench.main(["--samples", "2", "--calls", "1", "--passes", "1", "--sizes", "1", "8",
                       "--repeats", "0", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    layouts = report["metadata_layouts"]
    assert len(layouts) == 3 and layouts[1:] == ["vllm-ascend-v0.19.1rc1-standin",
                                                 "vllm-ascend-v0.26.0rc-standin"]
    assert [t["name"] for t in report["targets"]] == [
        f"engine_path_vs_plugin_{layout}_{size}_requests" for layout in layouts for size in (1, 8)]
    assert all(isinstance(t["met"], bool) and t["measured_ratio_thread_cpu"] > 0
               and t["max_ratio"] == 1.0 for t in report["targets"])
    # The plugin does not split one request: the target says so.
    assert all(("note" in t) == (t["num_requests"] == 1) for t in report["targets"])
    assert len(report["load_average_before"]) == 3 and isinstance(report["load_ok"], bool)
    assert len(report["load_attempts"]) == 1
    context = report["context_host_cost_vs_modelled_step"]["per_layout_and_size"]
    assert all(0 < row["host_fraction"] < 1 for row in context)
    # The summary is the last line: importing a real vLLM logs an INFO line to stdout first.
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("engine_path_bench: ")
    for row in report["sizes"]:
        # The floor of the breakdown replays exactly the adapter's device ops.
        assert row["floor_matches_adapter_ops"], row["adapter_aten_ops"]
        assert set(row["breakdown_thread_cpu_us"]) == {
            "engine_plan_only", "adapter_split", "request_check", "torch_ops_floor"}


def test_a_loaded_run_is_repeated_then_flagged(monkeypatch):
    """Above the load limit the run repeats, keeps its quietest attempt and says load_ok=False."""
    sys.path.insert(0, str(BENCH_DIR))
    try:
        import bench_load
    finally:
        sys.path.remove(str(BENCH_DIR))
    loads = iter([(5.0, 1, 1), (4.0, 1, 1), (3.0, 1, 1), (2.5, 1, 1), (1.5, 1, 1), (1.0, 1, 1)])
    monkeypatch.setattr(bench_load.os, "getloadavg", lambda: next(loads))
    runs = iter(range(3))
    slept = []
    report = bench_load.run_until_quiet(lambda: {"run": next(runs)}, repeats=1, sleep=slept.append)
    assert report["run"] == 1 and report["load_ok"] is False and len(slept) == 1
    assert report["load_attempts"] == [{"load_1m_before": 5.0, "load_1m_after": 4.0},
                                       {"load_1m_before": 3.0, "load_1m_after": 2.5}]
    quiet = bench_load.run_until_quiet(lambda: {"run": next(runs)}, repeats=3, sleep=slept.append)
    assert quiet["load_ok"] is True and len(quiet["load_attempts"]) == 1
    assert "NOT a clean run" in bench_load.load_note(report)


@pytest.mark.parametrize("seed", range(5))
def test_plugin_style_search_picks_the_request_boundary_policys_cut(bench, seed):
    lengths = np.random.default_rng(seed).integers(1, 5000, 40)
    head, tail = bench.plugin_style_request_boundary(lengths)
    plan = plan_split(lengths, policy="request_boundary")
    assert head[1].stop == tail[1].start == plan.split_token
    assert head[0].stop == plan.ubatches[1].request_slice.start
