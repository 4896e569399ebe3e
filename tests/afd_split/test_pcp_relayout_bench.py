"""pcp_relayout_bench runs end to end: a met flag per case, the moved volume, the load rule
(no timing asserted)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "pcp_relayout_bench.py"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH.parent))  # the benchmarks import bench_load as a sibling
    spec = importlib.util.spec_from_file_location("pcp_relayout_bench_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
        sys.path.remove(str(BENCH.parent))


def test_report_has_a_target_per_case_and_what_moved(bench, tmp_path, capsys):
    out = tmp_path / "pcp.json"
    assert bench.main(["--rounds", "1", "--repeats", "0", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [target["case"] for target in report["targets"]] == list(bench.CASES)
    assert all(isinstance(target["met"], bool) for target in report["targets"])
    assert isinstance(report["load_ok"], bool) and len(report["load_attempts"]) == 1
    for name, figure in report["figures"].items():
        moved = figure["moved"]
        assert moved["exchanged_requests"], name  # every case cuts inside a request
        # each rank receives at most its own rows of the stages, never a whole-batch gather
        assert moved["rows_received_in"] <= sum(moved["stage_rows_per_rank"])
        assert figure["total_ms"]["p10"] <= figure["total_ms"]["median"]
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("pcp_relayout (pcp 8): ") and "targets met" in line
