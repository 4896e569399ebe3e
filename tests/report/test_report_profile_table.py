"""The report's profile table: one row per instrumented case, each field from its profile,
absent fields shown as absent (never as zeros), nothing when no case was profiled."""

from __future__ import annotations

from pytest_afd.report.loading import LoadedResult
from pytest_afd.report.profile_table import HEADER, profile_table
from pytest_afd.report.tables import EMPTY

PROFILE = {
    "per_step": [{"step": "0", "overlap_fraction": 0.5, "exposed_bubble_s": 0.2,
                  "critical_path_s": 1.0},
                 {"step": "1", "overlap_fraction": 0.7, "exposed_bubble_s": {"absent_reason": "x",
                                                                             "value": None},
                  "critical_path_s": 2.0}],
    "straggler": {"total_s": 0.25, "per_layer": []},
    "collectives": [{"role": "attention", "group": "afd_connector", "ops_per_step": 38.0,
                     "time_s_per_step": 0.004, "volume_mb_per_step": 0.5}],
    "roles": {"attention": {"busy_fraction": 0.75}, "ffn": {"busy_fraction": 0.25}},
    "profiler_overhead": {"ratio": 1.5},
}


def result(case_id: str, profile) -> LoadedResult:
    evidence = {} if profile is None else {"profile": profile}
    return LoadedResult(None, {"case_id": case_id, "evidence": evidence,
                               "settings": {"split_policy": "token_balanced"}})


def test_one_row_per_profiled_case_from_its_fields():
    lines = profile_table([result("a", PROFILE), result("b", None),
                           result("c", {"absent_reason": "no traces", "value": None})])
    rows = [line for line in lines if line.startswith("| a ")]
    assert len(lines) == 6 and len(rows) == 1  # title, blank, header, rule, one row, blank
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert dict(zip(HEADER, cells, strict=True)) == {
        "case": "a", "policy": "token_balanced", "overlap (mean)": "0.6",
        "exposed bubble s (mean)": "0.2", "critical path s (mean)": "1.5",
        "FFN straggler s": "0.25",
        "collectives per step": "attention/afd_connector: 38 ops, 4 ms, 0.5 MB",
        "busy Attention / FFN": "0.75 / 0.25",
        "profiler overhead": "x1.5 (instrumented / measured wall)"}


def test_absent_fields_are_shown_absent_and_no_profile_no_table():
    sparse = {"per_step": [], "roles": {}, "profiler_overhead": {"absent_reason": "x",
                                                                 "value": None}}
    row = profile_table([result("a", sparse)])[4]
    assert row.count(EMPTY) == 6 + 2  # six empty cells, busy "— / —"
    assert profile_table([result("b", None)]) == []
