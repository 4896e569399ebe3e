"""cpu_backend_bench reports its targets with met flags (no timing asserted)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_backend_bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("cpu_backend_bench_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH.parent))


def test_targets_flag_the_default_run_time_and_the_8k_prefill(bench):
    result = {"wall_s": 200.0, "results": [{"tokens": 8192, "unsplit_s": {"median": 2.5}}]}
    found = {t["name"]: t for t in bench.targets(result, default_run=True)}
    assert found["default_run_wall_s"]["met"] is False
    assert found["unsplit_8k_prefill_s"] == {
        "name": "unsplit_8k_prefill_s", "limit": 10.0, "value": 2.5, "met": True
    }
    assert bench.targets(result, default_run=False)[0]["name"] == "unsplit_8k_prefill_s"


def test_a_small_run_writes_json_with_targets_and_a_summary(bench, tmp_path, capsys):
    out = tmp_path / "cpu.json"
    argv = ["--sizes", "64", "--repetitions", "1", "--no-transformers", "--output", str(out)]
    assert bench.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["targets"] == []  # not the default run, no 8k size: nothing to claim
    assert len(report["loadavg_before"]) == 3
    assert capsys.readouterr().out.startswith("cpu_backend_bench (1 interleaved repetitions")
