"""compare knows host noise: an A/A pair on a loaded host makes no call, a real slowdown does.

Results are built through the writer's own functions (metrics_from_runs,
host_json) from runs whose wall and CPU times and recorded load are given, so
the compare logic is tested without timing anything. The slowdown is the
seeded perf fault (pytest_afd.perf_fault.Slowdown) applied as the live fault
applies it.
"""

import json

import pytest
from report_builders import SMALL, make_result, write

from pytest_afd import host, perf_fault
from pytest_afd.__main__ import main
from pytest_afd.backends.base import RequestOutput, RunOutputs
from pytest_afd.report.compare import NO_DIFFERENCE
from pytest_afd.report.noise import (
    HostConditions,
    host_difference,
    read_calibration,
)
from pytest_afd.results import validate_result
from pytest_afd.workloads import make_workload

NODE = "suites/stage_d/test_stage_d_chunking.py::test_stage_d_chunk_sweep_then_best_two"
POLICIES = ("request_boundary", "token_balanced")
# 1-minute load averages on the 2-CPU host of the builders: busy is below one task per
# CPU, loaded is oversubscribed.
QUIET, BUSY, LOADED = 0.2, 1.8, 5.0
CPU_S = 0.9
SLOWDOWN = perf_fault.Slowdown(0.3)
CALLS = ("B better", "B worse")


def _side(directory, *, wall_s=1.0, load=QUIET, cpu_s=CPU_S, spread=0.01, fault=None):
    workload = make_workload("uniform", **SMALL)
    for policy in POLICIES:
        doc = make_result(
            f"{NODE}/uniform/{policy}", "stage_d", workload, policy, wall_s=wall_s,
            spread=spread, host=(cpu_s, load), fault=fault,
        )  # fmt: skip
        validate_result(doc)
        write(directory, doc)


def _rows(path):
    """Every data row of compare.md as cells (case, condition, metric, A, B, ratio, ..., notes)."""
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("| ") and NODE.rpartition("::")[2] in line:
            rows.append([c.strip() for c in line.strip("|").split("|")])
    assert rows, path.read_text()
    return rows


def _compare(tmp_path, a, b, *extra):
    out = tmp_path / "out"
    assert main(["compare", str(a), str(b), "--output", str(out), *extra]) == 0
    return _rows(out / "compare.md")


def _calls(rows):
    """(policy, metric) -> call."""
    return {(row[0].rpartition("/")[2], row[2]): row[7] for row in rows}


def test_a_a_pair_on_a_loaded_host_makes_no_call_and_names_the_host(tmp_path):
    # B is the same code, run while other processes load the host: wall time
    # stretches by half, CPU time by 8 % (contention), repetitions are tight.
    _side(tmp_path / "a", load=QUIET)
    _side(tmp_path / "b", wall_s=1.5, load=LOADED, cpu_s=CPU_S * 1.08)
    rows = _compare(tmp_path, tmp_path / "a", tmp_path / "b")
    assert len(rows) == len(POLICIES) * 3
    for row in rows:
        assert row[7] not in CALLS, row
        assert "host conditions differ (load 0.2 → 5)" in row[10]
        assert row[9] == "load 0.2 / 2 CPUs → load 5 / 2 CPUs"
    # Load 5 on 2 CPUs is oversubscribed: not even CPU time is comparable.
    assert set(_calls(rows).values()) == {"inconclusive: host conditions differ (load 0.2 → 5)"}


def test_a_a_pair_on_a_busier_host_compares_cpu_time_above_the_contention_floor(tmp_path):
    _side(tmp_path / "a", load=QUIET)
    _side(tmp_path / "b", wall_s=1.3, load=BUSY, cpu_s=CPU_S * 1.08)
    rows = _compare(tmp_path, tmp_path / "a", tmp_path / "b")
    for (_, metric), call in _calls(rows).items():
        if metric == "CPU time (s)":
            assert call == NO_DIFFERENCE  # 8 % apart, inside the 15 % contention floor
        else:
            assert call == "inconclusive: host conditions differ (load 0.2 → 1.8)"
    cpu_row = next(row for row in rows if row[2] == "CPU time (s)")
    assert cpu_row[8] == "±15.0% (host contention)"


def test_the_same_pair_on_a_quiet_host_would_have_been_called(tmp_path):
    # Control for the test above: without the recorded host difference the
    # stretched wall time is a call, so the host record is what stops it.
    _side(tmp_path / "a", load=QUIET)
    _side(tmp_path / "b", wall_s=1.5, load=QUIET, cpu_s=CPU_S * 1.08)
    calls = _calls(_compare(tmp_path, tmp_path / "a", tmp_path / "b"))
    assert {call for (_, metric), call in calls.items() if metric != "CPU time (s)"} == {"B worse"}


def test_a_seeded_30_percent_slowdown_is_called_worse(tmp_path):
    _side(tmp_path / "a", spread=0.1)
    _side(tmp_path / "b", spread=0.1, fault=SLOWDOWN)
    rows = _compare(tmp_path, tmp_path / "a", tmp_path / "b")
    assert set(_calls(rows).values()) == {"B worse"}
    throughput = next(row for row in rows if row[2] == "prefill tokens/s")
    assert float(throughput[5]) == pytest.approx(1 / 1.3, rel=1e-3)


def test_a_seeded_slowdown_on_a_busier_host_is_still_called_worse_by_cpu_time(tmp_path):
    _side(tmp_path / "a", load=QUIET, spread=0.1)
    _side(tmp_path / "b", wall_s=1.2, load=BUSY, spread=0.1, fault=SLOWDOWN)
    calls = _calls(_compare(tmp_path, tmp_path / "a", tmp_path / "b"))
    for (_, metric), call in calls.items():
        expected = "B worse" if metric == "CPU time (s)" else "inconclusive"
        assert call.startswith(expected), (metric, call)


def test_a_stored_a_a_calibration_widens_the_noise_floor(tmp_path):
    _side(tmp_path / "a")
    _side(tmp_path / "a2", wall_s=1.12)  # the same code again: 12 % apart on this host
    _side(tmp_path / "b", wall_s=1.10)
    _side(tmp_path / "slow", wall_s=1.0, fault=SLOWDOWN)
    calibration = tmp_path / "quiet-host.json"
    _compare(tmp_path, tmp_path / "a", tmp_path / "a2", "--calibrate", str(calibration))
    stored = read_calibration(calibration)
    assert stored.name == "quiet-host"
    case = f"{NODE}/uniform/token_balanced"
    assert stored.floors[case]["prefill tokens/s"] == pytest.approx(1 - 1 / 1.12, rel=1e-6)
    without = _calls(_compare(tmp_path, tmp_path / "a", tmp_path / "b"))
    assert without[("token_balanced", "prefill tokens/s")] == "B worse"
    rows = _compare(tmp_path, tmp_path / "a", tmp_path / "b", "--calibration", str(calibration))
    assert _calls(rows)[("token_balanced", "prefill tokens/s")] == NO_DIFFERENCE
    assert "A/A 'quiet-host'" in rows[0][8]
    slow = _compare(tmp_path, tmp_path / "a", tmp_path / "slow", "--calibration", str(calibration))
    assert _calls(slow)[("token_balanced", "prefill tokens/s")] == "B worse"


def test_a_bad_calibration_file_is_a_usage_error_naming_it(tmp_path, capsys):
    _side(tmp_path / "a")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kind": "afd-result"}))
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "--calibration", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "--calibration" in err and str(bad) in err and "--calibrate" in err


def test_host_difference_per_cpu_and_cpu_count():
    assert host_difference(HostConditions(2, 0.4), HostConditions(2, 1.2)) is None
    assert host_difference(HostConditions(2, 0.4), HostConditions(2, 2.0)) == "load 0.4 → 2"
    assert host_difference(HostConditions(2, 1.0), HostConditions(8, 1.0)).startswith("CPUs 2 → 8")
    assert host_difference(None, HostConditions(2, 9.0)) is None  # unrecorded: noted, not a diff


def _trivial_run():
    request = RequestOutput("r0", num_prompt_tokens=4, num_cached_tokens=0, next_token=1, ttft_s=0.5)
    return RunOutputs(requests=[request], wall_time_s=1.0)


def test_measured_run_records_the_host_and_the_fault_extends_the_run(monkeypatch):
    monkeypatch.delenv(perf_fault.PERF_FAULT_ENV, raising=False)
    plain = host.measured_run(_trivial_run)
    assert plain.wall_time_s == 1.0 and plain.host.rank_cpu_time_s is None
    assert len(plain.host.load_before) == 3 and plain.host.cpu_time_s >= 0
    monkeypatch.setenv(perf_fault.PERF_FAULT_ENV, "slowdown:0.3")
    slowed = host.measured_run(_trivial_run)
    extra = slowed.wall_time_s - 1.0
    assert extra > 0 and slowed.requests[0].ttft_s == pytest.approx(0.5 + extra)
    assert slowed.host.wall_time_s >= extra


@pytest.mark.parametrize(
    ("text", "named"),
    [("slowdwn:0.3", "unknown perf fault"), ("slowdown:x", "not a number"),
     ("slowdown:0", "expected 0 <")],
)  # fmt: skip
def test_a_bad_perf_fault_names_the_variable(monkeypatch, text, named):
    monkeypatch.setenv(perf_fault.PERF_FAULT_ENV, text)
    with pytest.raises(ValueError, match=named) as error:
        perf_fault.fault_from_env()
    assert perf_fault.PERF_FAULT_ENV in str(error.value)


def test_rank_cpu_times_sum_the_afd_steps():
    run = _trivial_run()
    run.steps = [{"afd": {"cpu_time_s": {"Attention rank 0": 0.5, "FFN rank 0": 0.25}}}] * 2
    assert host.rank_cpu_times(run) == {"Attention rank 0": 1.0, "FFN rank 0": 0.5}
    assert host.rank_cpu_times(_trivial_run()) is None
