"""Each repetition records the contention it met: CPU share, PSI stall seconds, runnable tasks.

Issue 40 finding 3: compare judged contention by the 1-minute load average,
which lags. The per-repetition record is read from /proc files given as paths
here (no timing), and compare decides "same contention" by the CPU shares.
"""

import pytest

from pytest_afd.core.backend import RequestOutput, RunOutputs
from pytest_afd.report.noise import HostConditions, host_difference, share_difference
from pytest_afd.results.documents import validate_result
from pytest_afd.stats import host
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_result

PSI = ("some avg10=99.57 avg60=99.69 avg300=95.00 total=900420657\n"
       "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")


def test_psi_and_runnable_are_read_or_absent_with_the_reason(tmp_path):
    psi, stat = tmp_path / "cpu", tmp_path / "stat"
    psi.write_text(PSI)
    stat.write_text("cpu  1 2 3\nprocs_running 5\nprocs_blocked 0\n")
    assert host.cpu_pressure_total_s(psi) == pytest.approx(900.420657)
    assert host.runnable_tasks(stat) == 5
    missing = host.cpu_pressure_total_s(tmp_path / "none")
    assert missing["value"] is None and "no PSI" in missing["absent_reason"]
    stat.write_text("cpu 1 2 3\n")
    assert "no procs_running" in host.runnable_tasks(stat)["absent_reason"]


def test_a_measured_run_records_its_cpu_share_and_contention_and_validates(monkeypatch):
    monkeypatch.delenv("PYTEST_AFD_PERF_FAULT", raising=False)

    def run():
        deadline = __import__("time").process_time() + 0.02  # some CPU work
        while __import__("time").process_time() < deadline:
            pass
        request = RequestOutput("r0", num_prompt_tokens=4, num_cached_tokens=0, next_token=1,
                                ttft_s=0.5)
        return RunOutputs(requests=[request], wall_time_s=1.0)

    outputs = host.measured_run(run)
    record = outputs.host.to_json()
    assert record["cpu_share"] == pytest.approx(record["cpu_time_s"] / record["wall_time_s"])
    assert record["cpu_share"] > 0
    pressure, runnable = record["cpu_pressure_some_s"], record["runnable"]
    assert pressure["absent_reason"] if isinstance(pressure, dict) else pressure >= 0
    if isinstance(runnable, dict):
        assert runnable["absent_reason"]
    else:
        assert len(runnable) == 2 and min(runnable) >= 1  # the sampler itself runs
    workload = make_workload("uniform", **SMALL)
    doc = make_result("suites/x.py::t/u/token_balanced", "stage_d", workload, "token_balanced",
                      host=(0.5, 1.0))
    doc["host"]["repetitions"][0].update(
        {key: record[key] for key in ("cpu_share", "cpu_pressure_some_s", "runnable")})
    validate_result(doc)


def test_the_same_cpu_share_is_the_same_contention_whatever_the_load_average_says():
    # The A/A pair: A began while the 1-minute load was still rising (2.6), B at
    # 3.8; both got half a CPU per repetition.
    rising = HostConditions(2, 2.6, (0.50, 0.49, 0.51))
    settled = HostConditions(2, 3.8, (0.50, 0.52, 0.48))
    assert host_difference(rising, settled) is None and share_difference(rising, settled) is None
    starved = HostConditions(2, 3.8, (0.30, 0.31, 0.29))
    assert host_difference(rising, starved) is None
    assert share_difference(rising, starved) == "CPU share 0.50 → 0.30 (load 2.6 → 3.8)"
    # Without shares (results from before they were recorded) the load rule stays.
    assert host_difference(HostConditions(2, 0.4), HostConditions(2, 2.0)) == "load 0.4 → 2"


def test_the_planted_slowdown_adds_work_in_proportion_to_the_runs_own_cpu(monkeypatch):
    """slowdown:0.5 is 1.5x the run's CPU work at any contention, not 0.5x its elapsed
    time (which on a host giving the run 5 % of a CPU was ten times its work)."""
    import time

    def run():
        deadline = time.process_time() + 0.05
        while time.process_time() < deadline:
            pass
        time.sleep(0.2)  # waiting (another task's turn): not work, must not be multiplied
        return RunOutputs(requests=[], wall_time_s=0.25)

    monkeypatch.setenv("PYTEST_AFD_PERF_FAULT", "slowdown:0.5")
    outputs = host.measured_run(run)
    assert 0.075 <= outputs.host.process_cpu_time_s < 0.075 + 0.1 * 0.5 + 0.05
    assert outputs.wall_time_s > 0.25
