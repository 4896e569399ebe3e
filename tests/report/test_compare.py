"""compare A B: shared cases side by side, ratio, interval and a noise-aware call."""

import pytest

from pytest_afd import report
from pytest_afd.__main__ import main
from pytest_afd.report.compare import (
    NO_DIFFERENCE,
    bootstrap_ratio_interval,
    significance_call,
)
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_manifest, make_result, stamped, write

NODE = "suites/stage_a/test_stage_a_policies.py::test_stage_a_policy_matrix[stage]"


def _side(directory, walls, *, session=None, created_at="2026-12-01T10:00:00+00:00"):
    workload = make_workload("uniform", **SMALL)
    for name, wall in walls.items():
        doc = make_result(f"{NODE}/uniform/{name}", "stage_a", workload, name, wall_s=wall)
        if session is not None:
            doc = stamped(doc, "passed", session=session, created_at=created_at)
        write(directory, doc)


def _row(text, policy, metric):
    return next(
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if f"/uniform/{policy} |" in line and f"| {metric} |" in line
    )


def test_significance_needs_the_interval_the_ranges_and_the_noise_floor():
    a, faster = [100.0, 110.0, 120.0], [250.0, 275.0, 300.0]
    ratio, interval, call = significance_call(a, faster, higher_is_better=True)
    assert ratio == pytest.approx(2.5) and interval[0] > 1 and call == "B better"
    # x2 is inside the uncalibrated between-session floor, beyond a calibrated 20 % one.
    doubled = [200.0, 220.0, 240.0]
    assert significance_call(a, doubled, higher_is_better=True)[2] == NO_DIFFERENCE
    assert significance_call(a, doubled, higher_is_better=True, floor=0.2)[2] == "B better"
    assert significance_call(a, faster, higher_is_better=False)[2] == "B worse"
    assert significance_call(a, [105.0, 115.0, 125.0], True)[2] == NO_DIFFERENCE  # overlap
    noisy_a, noisy_b = [20.0, 100.0, 101.0], [102.0, 103.0, 104.0]  # apart, 3 % < cv 63 %
    assert significance_call(noisy_a, noisy_b, True)[2] == NO_DIFFERENCE
    assert significance_call([], faster, True)[2] == "not measured"
    assert bootstrap_ratio_interval(a, faster) == bootstrap_ratio_interval(a, faster)  # seeded


def test_compare_two_directories(tmp_path, capsys, monkeypatch):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    _side(a_dir, {"none": 1.0, "request_boundary": 1.0, "token_balanced": 1.0})
    _side(b_dir, {"request_boundary": 1.0, "token_balanced": 0.4})
    def files():  # the validation cache (.afd-report-cache) is the loader's, not an output
        return {p: p.stat().st_mtime_ns for d in (a_dir, b_dir) for p in d.rglob("*.json")}

    before = files()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["compare", str(a_dir), str(b_dir)]) == 0
    # Its own folder, beside neither input; both inputs untouched.
    path = work / "afd-compare" / "a-vs-b" / "compare.md"
    assert files() == before and not list(b_dir.glob("compare*"))
    out = capsys.readouterr().out
    # The verdict in the terminal: the stage-wide table and every per-case call.
    assert "between-session noise: no A/A calibration of this host" in out
    assert "stage_a  prefill tokens/s" in out
    assert "test_stage_a_policy_matrix[stage]/uniform/token_balanced prefill tokens/s: " \
           "B better x2.5" in out
    assert out.rstrip().endswith(f"written: {path} (and compare.html, plots)")
    text = path.read_text()
    assert "2 shared case(s); 1 only in A, 0 only in B." in text
    faster = _row(text, "token_balanced", "prefill tokens/s")
    assert faster[5] == "2.5" and faster[7] == "B better"
    assert "n=3" in faster[3] and "cv " in faster[4]
    assert _row(text, "token_balanced", "TTFT p50 (s)")[7] == "B better"  # lower is better
    same = _row(text, "request_boundary", "prefill tokens/s")
    assert same[5] == "1" and same[7] == NO_DIFFERENCE
    assert path.with_name("compare.html").read_text().count("<table") == 2
    assert (path.parent / "plots" / "stage_a-a_vs_b.png").is_file()


def test_compare_two_sessions_of_one_directory(tmp_path):
    _side(tmp_path / "first", {"token_balanced": 1.0}, session="s1")
    _side(
        tmp_path / "second",
        {"token_balanced": 2.5},
        session="s2",
        created_at="2026-12-01T11:00:00+00:00",
    )
    out = tmp_path / "out"
    args = ["compare", str(tmp_path), str(tmp_path), "--a-session", "s1", "--b-session", "s2"]
    assert main([*args, "--output", str(out)]) == 0
    text = (out / "compare.md").read_text()
    assert f"A: `{tmp_path} session s1` (1 cases)" in text
    assert _row(text, "token_balanced", "prefill tokens/s")[7] == "B worse"


def test_compare_errors_name_the_selection(tmp_path, capsys):
    _side(tmp_path, {"token_balanced": 1.0})
    assert main(["compare", str(tmp_path), str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    assert main(["compare", str(tmp_path), str(tmp_path), "--b-session", "nope"]) == 2
    assert "session nope: no results match this selection" in capsys.readouterr().err


def test_stage_f_pair_is_shown_side_by_side_with_its_parity(tmp_path):
    workload = make_workload("uniform", **SMALL)
    reason = "backend 'cpu' does not declare 'pipeline_parallel'"
    node = "suites/stage_f/test_stage_f_pp_comparison.py::test_stage_f_afd_vs_pp"
    for role, topology, policy, wall in (
        ("afd", "dp3pcp8-ep8", "token_balanced", 1.0),
        ("pp", "pp4pcp8", "none", 1.25),
    ):
        doc = make_result(
            f"{node}/{role}/{topology}",
            "stage_f",
            workload,
            policy,
            wall_s=wall,
            manifest=make_manifest(topology=topology),
        )
        doc["labels"] = {
            "synthetic": False,
            "comparability": "exploratory",
            "comparability_reason": reason,
        }
        doc["evidence"]["parity"] = {
            "comparability": "exploratory",
            "reference": {"afd_layout": "dp3pcp8-ep8", "pp_layout": "pp4pcp8"},
        }
        write(tmp_path, doc)
    text = report.render(tmp_path).read_text()
    section = text[text.index("### AFD vs PP, side by side") :]
    row = next(
        line for line in section.splitlines() if line.startswith("| test_stage_f_afd_vs_pp |")
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "reduced/3L dp3pcp8-ep8" and cells[2] == "reduced/3L pp4pcp8"
    assert cells[5] == "1.25"  # AFD / PP throughput for the same tokens
    assert cells[8] == f"exploratory: {reason}"
    assert (
        tmp_path / "report" / "plots" / "stage_f-test_stage_f_afd_vs_pp-afd_vs_pp.png"
    ).is_file()
