"""Verdicts first: Stage A's ranking and every stage's conclusion lead the report; noise marked."""

from pytest_afd import report
from pytest_afd.stats import verdicts
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_result, stamped, write

NODE = "suites/stage_a/test_stage_a_policies.py::test_stage_a_policy_matrix[smallest]"
RANKING = {
    "scores": {"none": 1.0, "request_boundary": 1.01, "token_balanced": 1.03},
    "leader": "token_balanced",
    "runner_up": "request_boundary",
    "winner": None,
    "significant": False,
    "verdict": "no significant difference",
    "leader_vs_runner_up": {"ratio": 1.02, "interval": [0.97, 1.08], "confidence": 0.95,
                            "method": "percentile bootstrap over the repetitions"},
}
LATE = "2026-12-01T12:00:00+00:00"


def _write_stage_a(directory, walls, *, spread=0.1):
    for dataset, (control_wall, proposed_wall) in walls.items():
        workload = make_workload(dataset, **SMALL)
        for policy, wall in (("none", 1.0), ("request_boundary", control_wall),
                             ("token_balanced", proposed_wall)):
            doc = make_result(f"{NODE}/{dataset}/{policy}", "stage_a", workload, policy,
                              wall_s=wall, spread=spread)
            doc["evidence"]["stage_a"] = {"ranking": RANKING, "correlation": {}}
            write(directory, stamped(doc, "passed", session="s1", created_at=LATE))
    gate = make_result("suites/gates/test_gate_1_token_split.py::test_gate[x]", "gate",
                       make_workload("uniform", **SMALL), "token_balanced")
    write(directory, stamped(gate, "failed", session="s1", created_at=LATE, reason="boom"))


def test_the_report_leads_with_stage_a_and_every_stage_conclusion(tmp_path):
    # uniform: token_balanced 2 % faster inside a 10 %-per-repetition spread;
    # bimodal: 2.5x faster, beyond the between-session noise.
    _write_stage_a(tmp_path, {"uniform": (1.0, 0.98), "bimodal": (2.5, 1.0)})
    text = report.render(tmp_path).read_text()
    first_section = text.index("\n## ")
    assert text[first_section:].startswith("\n## Verdicts")
    head = text[: text.index("## Failures")]
    assert ("**Stage A (test_stage_a_policy_matrix[smallest])**: no significant difference: "
            "leader token_balanced over request_boundary x1.02 (95% interval 0.97–1.08)") in head
    assert "scores (throughput / baseline, geometric mean): token_balanced 1.03" in head
    stage_row = next(line for line in head.splitlines() if line.startswith("| [stage_a]"))
    assert "6 case(s): 6 passed" in stage_row
    assert "over 2 condition(s), 1 beyond the noise (1 faster, 0 slower)" in stage_row
    gate_row = next(line for line in head.splitlines() if line.startswith("| [gate]"))
    assert "1 case(s): 1 failed" in gate_row
    table = text[text.index("Median prefill tokens/s per policy:") :]
    uniform = next(line for line in table.splitlines() if line.startswith("| uniform"))
    assert uniform.endswith("(inside the noise) |")
    bimodal = next(line for line in table.splitlines() if line.startswith("| bimodal"))
    assert bimodal.endswith("| 2.5 (beyond the noise) |")


def test_summary_lines_say_the_same_for_the_terminal(tmp_path):
    _write_stage_a(tmp_path, {"uniform": (1.0, 0.98)})
    docs = [r.doc for r in report.load_results(tmp_path).results]
    lines = verdicts.summary_lines(docs, ("stage_a",))
    assert lines[0].startswith("Stage A (test_stage_a_policy_matrix[smallest]): no significant")
    assert lines[1].startswith("stage_a: 3 case(s): 3 passed; host: load not recorded; ")
    assert "; token_balanced / request_boundary geometric mean" in lines[1]
    assert lines[2].startswith("gate: 1 case(s): 1 failed")


def test_noise_mark_needs_apart_ranges_and_a_ratio_beyond_the_spread():
    assert verdicts.noise_mark([100, 110, 120], [250, 260, 270]) == verdicts.BEYOND_NOISE
    assert verdicts.noise_mark([100, 110, 120], [140, 150, 160]) == verdicts.INSIDE_NOISE
    assert verdicts.noise_mark([100, 110, 120], [115, 125, 135]) == verdicts.INSIDE_NOISE
    assert verdicts.noise_mark([20, 100, 101], [102, 103, 104]) == verdicts.INSIDE_NOISE
    assert verdicts.noise_mark([], [1.0]) == verdicts.INSIDE_NOISE


def test_the_report_counts_lost_profiles_first(tmp_path):
    """Issue 45: the verdicts open with the session's profile count and the cases lost."""
    reason = "no trace files were written under /tmp/afd-traces-x: no rank's profiler exported a trace"
    workload = make_workload("uniform", **SMALL)
    for policy in ("request_boundary", "token_balanced"):
        doc = make_result(f"{NODE}/uniform/{policy}", "stage_a", workload, policy, wall_s=1.0)
        doc["evidence"]["profile"] = {"value": None, "absent_reason": reason}
        write(tmp_path, stamped(doc, "passed", session="s1", created_at=LATE))
    text = report.render(tmp_path).read_text()
    verdict_section = text[text.index("## Verdicts"):]
    assert verdict_section.split("\n")[2] == (
        f"**profiles: 0 of 2 instrumented cases; most common reason (2 of 2 lost): {reason}**.")
