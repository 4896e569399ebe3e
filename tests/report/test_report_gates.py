"""Gates get their own section: logit error against tolerance per case, one figure, no perf plots."""

from pytest_afd import report
from pytest_afd.golden.store import PROFILES
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_result, stamped, write

NODE = "suites/gates/test_gate_1_token_split.py::test_gate_1_token_split"
LATE = "2026-12-01T12:00:00+00:00"


def _gate(directory, name, status, error, profile="float32"):
    doc = make_result(f"{NODE}[{name}]", "gate", make_workload("uniform", **SMALL),
                      "token_balanced")
    doc["evidence"]["gate"] = {"gate": 1, "case": name, "verdict": {
        "tolerance_profile": PROFILES[profile].describe(), "outputs_within_tolerance": status == "passed",
        "max_abs_error": error, "max_rel_error": error, "report": "", "invariant_violations": [],
        "invariant_checked_forwards": 2, "greedy_token_mismatches": [],
    }}  # fmt: skip
    write(directory, stamped(doc, status, session="s", created_at=LATE, reason="beyond tolerance"))


def test_gates_show_logit_error_against_tolerance_in_their_own_section(tmp_path):
    atol = PROFILES["float32"].atol
    _gate(tmp_path, "uniform", "passed", atol / 4)
    _gate(tmp_path, "bimodal", "failed", atol * 8)
    text = report.render(tmp_path).read_text()
    section = text[text.index("## gate:") :]
    header = next(line for line in section.splitlines() if line.startswith("| case |"))
    assert "| tolerance | max abs logit error | atol | error / atol |" in header
    failed = next(line for line in section.splitlines() if "[bimodal]" in line)
    cells = [c.strip() for c in failed.strip("|").split("|")]
    assert cells[2].startswith("failed") and cells[3] == PROFILES["float32"].describe()
    assert cells[6] == "8"
    passed = next(line for line in section.splitlines() if "[uniform]" in line)
    assert [c.strip() for c in passed.strip("|").split("|")][6] == "0.25"
    plots = sorted(p.name for p in (tmp_path / "report" / "plots").glob("*.png"))
    assert plots == ["gates-logit_error.png"]  # one figure, none of the performance plots
    assert "### Stack" not in section


def test_zero_error_gates_are_bit_identical_in_the_table_not_bars(tmp_path):
    atol = PROFILES["float32"].atol
    for name in ("a", "b", "c"):
        _gate(tmp_path, name, "passed", 0.0)
    text = report.render(tmp_path).read_text()
    section = text[text.index("## gate:"):]
    row = next(line for line in section.splitlines() if "[a]" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == "0 (bit-identical)" and cells[6] == "0 (bit-identical)"
    assert "3 case(s) are bit-identical to their reference" in section
    assert not list((tmp_path / "report" / "plots").glob("*.png"))  # no bars of nothing
    _gate(tmp_path, "d", "passed", atol / 2)
    report.render(tmp_path)
    assert [p.name for p in (tmp_path / "report" / "plots").glob("*.png")] == [
        "gates-logit_error.png"]
