"""compare knows host noise: an A/A pair on a loaded host makes no call, a real slowdown does.

Results are built through the writer's own functions (metrics_from_runs,
host_json) from runs whose wall and CPU times and recorded load are given, so
the compare logic is tested without timing anything. The slowdown is the
seeded perf fault (pytest_afd.faults.perf.Slowdown) applied as the live fault
applies it.
"""

import json

import numpy as np
import pytest

from pytest_afd.__main__ import main
from pytest_afd.core.backend import RequestOutput, RunOutputs
from pytest_afd.faults import perf as perf_fault
from pytest_afd.report.compare import CPU_DISAGREES, NO_DIFFERENCE, significance_call
from pytest_afd.report.noise import (
    CALIBRATION_ENV,
    HostConditions,
    host_difference,
    read_calibration,
)
from pytest_afd.stats import host, session_noise
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_result, write

NODE = "suites/stage_d/test_stage_d_chunking.py::test_stage_d_chunk_sweep_then_best_two"
POLICIES = ("request_boundary", "token_balanced")
# 1-minute load averages on the 2-CPU host of the builders: busy is below one task per
# CPU, loaded is oversubscribed.
QUIET, BUSY, LOADED = 0.2, 1.8, 5.0
CPU_S = 0.9
SLOWDOWN = perf_fault.Slowdown(0.3)
CALLS = ("B better", "B worse")


def _side(directory, *, wall_s=1.0, load=QUIET, cpu_s=None, spread=0.01, fault=None):
    """One side's results; CPU time ``cpu_s`` (default: the wall time's CPU_S share, the
    CPU-bound work of a host under the same contention)."""
    workload = make_workload("uniform", **SMALL)
    cpu_s = CPU_S * wall_s if cpu_s is None else cpu_s
    for policy in POLICIES:
        doc = make_result(
            f"{NODE}/uniform/{policy}", "stage_d", workload, policy, wall_s=wall_s,
            spread=spread, host=(cpu_s, load), fault=fault,
        )  # fmt: skip
        write(directory, doc)  # validates against the schema first, as validate_result


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
    assert main(["compare", str(a), str(b), "--output", str(out), *extra]) == 0, str(out)
    return _rows(out / "compare.md")


def _stage_calls(path):
    """metric -> the stage-wide call of compare.md's "Stage-wide calls" table."""
    section = path.read_text().split("## Stage-wide calls")[1].split("\n## ")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| stage_")]
    return {row[1]: row[6] for row in rows}


def _calls(rows):
    """(policy, metric) -> call."""
    return {(row[0].rpartition("/")[2], row[2]): row[7] for row in rows}


def test_a_a_pair_on_a_loaded_host_makes_no_call_and_names_the_host(tmp_path):
    # B is the same code, run while other processes load the host: wall time
    # stretches by half, CPU time by 8 % (contention): its CPU share fell from 0.9 to 0.65.
    _side(tmp_path / "a", load=QUIET)
    _side(tmp_path / "b", wall_s=1.5, load=LOADED, cpu_s=CPU_S * 1.08)
    rows = _compare(tmp_path, tmp_path / "a", tmp_path / "b")
    assert len(rows) == len(POLICIES) * 3
    differ = "host conditions differ (CPU share 0.90 → 0.65 (load 0.2 → 5))"
    for row in rows:
        assert row[7] not in CALLS, row
        assert differ in row[10]
        assert row[9] == "load 0.2 / 2 CPUs, CPU share 0.90 → load 5 / 2 CPUs, CPU share 0.65"
    # Load 5 on 2 CPUs is oversubscribed: not even CPU time is comparable.
    assert set(_calls(rows).values()) == {f"inconclusive: {differ}"}


def test_a_a_pair_on_a_busier_host_compares_cpu_time_above_the_contention_floor(tmp_path):
    _side(tmp_path / "a", load=QUIET)
    _side(tmp_path / "b", wall_s=1.3, load=BUSY, cpu_s=CPU_S * 1.08)
    rows = _compare(tmp_path, tmp_path / "a", tmp_path / "b")
    for (_, metric), call in _calls(rows).items():
        if metric == "CPU time (s)":
            assert call == NO_DIFFERENCE  # 8 % apart, inside the floors
        else:
            assert call.startswith("inconclusive: host conditions differ (CPU share 0.90 → ")


def test_the_same_pair_on_a_quiet_host_is_inside_the_between_session_noise(tmp_path):
    # Without a host difference, a 1.5x slower wall time with tight repetitions is still
    # inside what sessions on this host move a case by (x2 uncalibrated) and CPU time did
    # not move: no call, and the output states the rule it used.
    _side(tmp_path / "a", load=QUIET)
    _side(tmp_path / "b", wall_s=1.5, load=QUIET, cpu_s=CPU_S * 1.5 * 1.08)
    out = tmp_path / "out"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--output", str(out)]) == 0
    calls = _calls(_rows(out / "compare.md"))
    assert set(calls.values()) == {NO_DIFFERENCE}
    # The same wall times with the CPU time unmoved: B got a third less CPU (waiting or
    # contention, only an interleaved run tells which): inconclusive, not a call.
    _side(tmp_path / "c", wall_s=1.5, load=QUIET, cpu_s=CPU_S * 1.08)
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "c"), "--output", str(out)]) == 0
    calls = _calls(_rows(out / "compare.md"))
    assert {call for (_, metric), call in calls.items() if metric != "CPU time (s)"} == {
        "inconclusive: host conditions differ (CPU share 0.90 → 0.65 (load 0.2 → 0.2))"}
    assert session_noise.UNCALIBRATED_RULE in (out / "compare.md").read_text()


def test_a_wall_time_change_that_cpu_time_does_not_share_is_not_called():
    a, b = [100.0, 101.0, 102.0], [300.0, 301.0, 302.0]
    assert significance_call(a, b, True)[2] == "B better"
    assert significance_call(a, b, True, cpu_agrees=False)[2] == (
        f"{NO_DIFFERENCE} ({CPU_DISAGREES})")


def test_a_seeded_30_percent_slowdown_is_called_worse_stage_wide(tmp_path):
    _side(tmp_path / "a", spread=0.1)
    _side(tmp_path / "b", spread=0.1, fault=SLOWDOWN)
    rows = _compare(tmp_path, tmp_path / "a", tmp_path / "b")
    throughput = next(row for row in rows if row[2] == "prefill tokens/s")
    assert float(throughput[5]) == pytest.approx(1 / 1.3, rel=1e-3)
    stage = _stage_calls(tmp_path / "out" / "compare.md")
    assert {metric: call for metric, call in stage.items()} == {
        "prefill tokens/s": "B worse", "TTFT p50 (s)": "B worse", "CPU time (s)": "B worse"}


def test_a_seeded_slowdown_on_a_busier_host_is_still_called_worse_by_cpu_time(tmp_path):
    _side(tmp_path / "a", load=QUIET, spread=0.1)
    _side(tmp_path / "b", wall_s=1.2, load=BUSY, spread=0.1, fault=SLOWDOWN)
    _compare(tmp_path, tmp_path / "a", tmp_path / "b")
    stage = _stage_calls(tmp_path / "out" / "compare.md")
    assert stage["CPU time (s)"] == "B worse"
    # B's load average was higher, but its repetitions got the CPU share A's got (the
    # fault's spin is CPU work): the same contention, so wall time is called too.
    assert stage["prefill tokens/s"] == "B worse"


def test_calibrate_from_runs_is_stored_for_the_host_and_used_by_default(tmp_path, monkeypatch,
                                                                        capsys):
    stored = tmp_path / "host-calibration.json"
    monkeypatch.setenv(CALIBRATION_ENV, str(stored))
    _side(tmp_path / "a")
    _side(tmp_path / "a2", wall_s=1.12)  # the same code again: 12 % apart on this host
    _side(tmp_path / "a3", wall_s=0.95)
    assert main(["compare", "--calibrate", str(tmp_path / "a"), str(tmp_path / "a2"),
                 str(tmp_path / "a3")]) == 0
    assert f"A/A calibration of 3 runs (3 pairs sharing cases) stored in {stored}" in (
        capsys.readouterr().out)
    calibration = read_calibration(stored)
    case = f"{NODE}/uniform/token_balanced"
    # widest pair: a2 / a3, 1.12 / 0.95 apart
    assert calibration.floors[case]["prefill tokens/s"] == pytest.approx(1.12 / 0.95 - 1)
    assert calibration.stage_floor("stage_d", "prefill tokens/s") == pytest.approx(1.12 / 0.95 - 1)
    _side(tmp_path / "slow", wall_s=1.0, fault=SLOWDOWN)
    rows = _compare(tmp_path, tmp_path / "a", tmp_path / "slow")
    assert "A/A 'host-calibration'" in rows[0][8]
    assert _stage_calls(tmp_path / "out" / "compare.md")["prefill tokens/s"] == "B worse"
    # 12 % slower is inside the calibration: no call; --no-calibration states the rule.
    _side(tmp_path / "b", wall_s=1.12)
    _compare(tmp_path, tmp_path / "a", tmp_path / "b")
    assert set(_stage_calls(tmp_path / "out" / "compare.md").values()) == {NO_DIFFERENCE}


def test_calibrate_needs_two_runs_and_names_them(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path / "c.json"))
    _side(tmp_path / "a")
    assert main(["compare", "--calibrate", str(tmp_path / "a")]) == 2
    assert "at least two runs" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


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


# --- three stage_d-shaped sessions of the same code on a loaded host -------------------------
STAGE_D_CASES = (
    *(f"sweep/bimodal/{c}" for c in ("chunk128", "chunk256", "chunk512", "chunk1024",
                                      "unchunked")),
    *(f"best/{w}/{c}" for w in ("uniform", "uniform-hit75", "long_short", "long_short-hit75")
      for c in ("chunk512", "chunk1024", "unchunked")),
)
AA_LOAD = 3.0  # the host: load 2.9–3.0 on 2 CPUs, oversubscribed, equal between runs
# What sessions move single cases by on this host (docs/report.md): each session's factor
# log-normal with spread 0.15, so two sessions differ by at most x1.78 (the A/A
# pair); repetition spread 10–30 % per repetition (CV 9–23 %).
SESSION_SIGMA, MAX_SWING = 0.15, 1.78
HALF_SWING = MAX_SWING ** 0.5


def _session(directory, rng, *, fault=None, swing=None):
    workload = make_workload("bimodal", **SMALL)
    for index, case in enumerate(STAGE_D_CASES):
        factor = float(np.clip(np.exp(rng.normal(0, SESSION_SIGMA)), 1 / HALF_SWING, HALF_SWING))
        if swing is not None and index == 0:
            factor = swing
        wall = (0.5 + 0.1 * index) * factor
        doc = make_result(f"{NODE}/{case}", "stage_d", workload, "token_balanced", wall_s=wall,
                          spread=float(rng.uniform(0.1, 0.3)), host=(0.9 * wall, AA_LOAD),
                          fault=fault)  # fmt: skip
        write(directory, doc)


def _all_calls(tmp_path, a, b):
    out = tmp_path / f"{a.name}-{b.name}"
    assert main(["compare", str(a), str(b), "--output", str(out)]) == 0
    text = (out / "compare.md").read_text()
    cases = [[c.strip() for c in line.strip("|").split("|")][7] for line in text.splitlines()
             if line.startswith("| test_stage_d")]
    return cases, _stage_calls(out / "compare.md")


def test_three_same_code_sessions_on_a_loaded_host_make_no_call_and_a_slowdown_is_called(
        tmp_path):
    rng = np.random.default_rng(7)
    runs = [tmp_path / f"run{i}" for i in range(3)]
    for index, run in enumerate(runs):
        # case 0: the x1.78 between run0 and run1
        _session(run, rng, swing={0: 1 / HALF_SWING, 1: HALF_SWING}.get(index))
    for a, b in ((0, 1), (0, 2), (1, 2)):
        cases, stage = _all_calls(tmp_path, runs[a], runs[b])
        assert len(cases) == len(STAGE_D_CASES) * 3
        assert not [c for c in cases if c in CALLS], (a, b, cases)
        assert not [c for c in stage.values() if c in CALLS], (a, b, stage)
    # The same shapes, B under the seeded 30 % slowdown: the stage moves as a whole.
    _session(tmp_path / "slow", rng, fault=SLOWDOWN)
    cases, stage = _all_calls(tmp_path, runs[0], tmp_path / "slow")
    assert stage == {"prefill tokens/s": "B worse", "TTFT p50 (s)": "B worse",
                     "CPU time (s)": "B worse"}
