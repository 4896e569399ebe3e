"""Every stage's conclusion follows its own table, references included, winners beyond the noise.

Each test feeds the conclusion code results where the reference (``unchunked``,
``none``) is fastest, or where two candidates lie inside the noise, renders the
report, and checks the stage's conclusion line against the "Fastest per
condition" table of the same report, and both against the numbers fed in.
"""

import pytest

from pytest_afd import report
from pytest_afd.stats import conclusions, session_noise, verdicts
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_result, stamped, write

STAGE_D = "suites/stage_d/test_stage_d_chunking.py::test_stage_d_chunk_sweep_then_best_two"
STAGE_A = "suites/stage_a/test_stage_a_policies.py::test_stage_a_policy_matrix[smallest]"
STAGE_C = "suites/stage_c/test_stage_c_distributions.py::test_stage_c[x]"
LATE = "2026-12-01T12:00:00+00:00"
QUIET, OVERSUBSCRIBED = 0.4, 4.3  # 1-minute loads on the builders' 2-CPU host
# Repetitions 30 % apart: inside one session a 10-35 % move is then inside the noise.
WIDE = 0.3


def _write(directory, node, kind, variants, *, dataset="bimodal", spread=0.02, load=QUIET,
           extra_evidence=None):
    """variants: case-id tail -> (policy, chunk size, wall seconds)."""
    workload = make_workload(dataset, **SMALL)
    docs = []
    for tail, (policy, chunk, wall) in variants.items():
        doc = make_result(f"{node}/{tail}", kind, workload, policy, wall_s=wall,
                          chunk_size=chunk, spread=spread, host=(0.5, load))
        doc["evidence"].update(extra_evidence or {})
        doc = stamped(doc, "passed", session="s1", created_at=LATE)
        write(directory, doc)
        docs.append(doc)
    return docs


def _report(directory):
    text = report.render(directory, plots=False).read_text()  # the tables are what is read
    conclusion = {line.split("|")[1].strip(): line for line in text.splitlines()
                  if line.startswith("| [stage_")}
    section = text[text.index("Fastest per condition"):].split("\n\n")[1]
    fastest = [line for line in section.splitlines()
               if line.startswith("| ") and not line.startswith("| condition")]
    return text, conclusion, [[c.strip() for c in row.strip("|").split("|")] for row in fastest]


def test_stage_d_says_the_unchunked_reference_was_fastest(tmp_path):
    # The issue's sweep: unchunked 1.35x faster than the fastest chunk size, all inside the
    # noise (repetitions 30 % apart); the follow-ups' chunk sizes are named as what ran,
    # not as the answer.
    _write(tmp_path, STAGE_D, "stage_d", {
        "sweep/bimodal-fixed/chunk512": ("token_balanced", 512, 1.6),
        "sweep/bimodal-fixed/chunk1024": ("token_balanced", 1024, 1.35),
        "sweep/bimodal-fixed/unchunked": ("token_balanced", None, 1.0),
    }, extra_evidence={"stage_d_best_sizes": [1024, 512]}, spread=WIDE)  # fmt: skip
    _, conclusion, table = _report(tmp_path)
    line = conclusion["[stage_d](#stage_d)"]
    assert table == [["sweep/bimodal-fixed", "unchunked", table[0][2], "chunk1024",
                      table[0][4], "x1.35", conclusions.INSIDE]]
    assert ("the reference was fastest in 1 of 1 condition(s): sweep/bimodal-fixed "
            "(unchunked x1.35 over chunk1024, inside the noise)") in line
    assert "no winner beyond the noise" in line
    assert "follow-ups ran chunk sizes 1024, 512" in line and "not a verdict" in line


def test_stage_d_names_a_chunk_size_only_beyond_the_noise(tmp_path):
    # chunk1024 is 2.5x the unchunked reference with 2 % spread: a winner.
    _write(tmp_path, STAGE_D, "stage_d", {
        "sweep/bimodal-fixed/chunk1024": ("token_balanced", 1024, 0.4),
        "sweep/bimodal-fixed/unchunked": ("token_balanced", None, 1.0),
    })  # fmt: skip
    _, conclusion, table = _report(tmp_path)
    assert table[0][1] == "chunk1024" and table[0][6] == conclusions.WINNER
    assert ("a winner beyond the noise in 1 of 1: sweep/bimodal-fixed: "
            "chunk1024 x2.5 over unchunked") in conclusion["[stage_d](#stage_d)"]
    assert "the reference was fastest" not in conclusion["[stage_d](#stage_d)"]


def test_two_candidates_inside_the_noise_make_no_winner(tmp_path):
    # token_balanced 15 % faster than request_boundary inside a 30 %-per-repetition spread:
    # inside the noise of one session, so neither the table nor the line names it
    # (with 2 % spread it is a winner: tests/report/test_within_session_power.py).
    _write(tmp_path, STAGE_C, "stage_c", {
        "bimodal/fixed/none": ("none", None, 1.5),
        "bimodal/fixed/request_boundary": ("request_boundary", None, 1.15),
        "bimodal/fixed/token_balanced": ("token_balanced", None, 1.0),
    }, spread=WIDE)  # fmt: skip
    text, conclusion, table = _report(tmp_path)
    assert table[0][1] == "token_balanced" and table[0][3] == "request_boundary"
    assert table[0][6] == conclusions.INSIDE
    line = conclusion["[stage_c](#stage_c)"]
    assert "no winner beyond the noise in any of 1 condition(s)" in line
    assert "0 beyond the noise" in line
    comparison = next(row for row in text.splitlines() if row.startswith("| bimodal"))
    assert comparison.endswith("(inside the noise) |")


def test_stage_a_says_when_no_split_was_fastest(tmp_path):
    _write(tmp_path, STAGE_A, "stage_a", {
        "uniform/none": ("none", None, 1.0),
        "uniform/request_boundary": ("request_boundary", None, 1.1),
        "uniform/token_balanced": ("token_balanced", None, 1.2),
    }, dataset="uniform", spread=WIDE)  # fmt: skip
    _, conclusion, table = _report(tmp_path)
    assert table[0][1:2] == ["none"]
    assert ("the reference was fastest in 1 of 1 condition(s): [smallest] uniform (none x1.1 over "
            "request_boundary, inside the noise)") in conclusion["[stage_a](#stage_a)"]


@pytest.mark.parametrize(("load", "provisional"), [(QUIET, False), (OVERSUBSCRIBED, True)])
def test_verdicts_show_the_host_and_are_provisional_when_oversubscribed(
        tmp_path, load, provisional):
    docs = _write(tmp_path, STAGE_D, "stage_d", {
        "sweep/bimodal-fixed/chunk1024": ("token_balanced", 1024, 0.5),
        "sweep/bimodal-fixed/unchunked": ("token_balanced", None, 1.0),
    }, load=load)  # fmt: skip
    line = verdicts.summary_lines(docs, ("stage_d",))[0]
    assert f"host: session s1 load {load:.2g}–{load:.2g} on 2 CPUs" in line
    assert line.startswith("stage_d: provisional: the host was oversubscribed (1-minute load "
                           "4.3 on 2 CPUs") == provisional
    _, conclusion, _ = _report(tmp_path)
    assert ("provisional" in conclusion["[stage_d](#stage_d)"]) == provisional


def test_the_conservative_rule_ignores_tight_but_session_sized_moves():
    # x1.99 with 2 % CVs: ranges apart, 50 CVs away, still inside the x2 floor (a real A/A
    # pair of sessions on this host moved a case by x1.99 at CVs of 23 % and 8 %).
    assert not session_noise.beyond([100, 101, 102], [199, 200, 201])
    assert session_noise.beyond([100, 101, 102], [210, 211, 212])
    assert session_noise.beyond([210, 211, 212], [100, 101, 102])  # x0.48: as far, either way
    # x1.78 with CV 10 % and 25 % (the issue's A/A pair).
    assert not session_noise.beyond([1250, 1377, 1520], [1700, 2448, 2900])
    # A calibrated floor replaces the rule: 20 % measured between sessions here.
    assert session_noise.beyond([100, 101, 102], [130, 131, 132], floor=0.2)


STAGE_CASES = {
    # stage: (node, {tail: (policy, wall)}) — one condition inside the noise, one with a winner
    "stage_b": ("suites/stage_b/test_stage_b_prefix_cache.py::test_stage_b[x]", {
        "hit50/steady/none": ("none", 1.0), "hit50/steady/token_balanced": ("token_balanced", 0.9),
        "hit0/cold/none": ("none", 1.0), "hit0/cold/token_balanced": ("token_balanced", 0.3)}),
    "stage_e": ("suites/stage_e/test_stage_e_routing.py::test_stage_e[x]", {
        "full/natural": ("token_balanced", 1.0), "full/forced_balanced": ("token_balanced", 1.1)}),
    "stage_f": ("suites/stage_f/test_stage_f_pp_comparison.py::test_stage_f_afd_vs_pp", {
        "afd/dp3pcp8-ep8": ("token_balanced", 1.0), "pp/pp4pcp8": ("none", 3.0)}),
}


@pytest.mark.parametrize("stage", sorted(STAGE_CASES))
def test_every_stage_conclusion_says_what_its_table_says(tmp_path, stage):
    node, cases = STAGE_CASES[stage]
    _write(tmp_path, node, stage, {tail: (policy, None, wall)
                                   for tail, (policy, wall) in cases.items()}, spread=WIDE)
    _, conclusion, table = _report(tmp_path)
    line = conclusion[f"[{stage}](#{stage})"]
    winners = [row for row in table if row[6] == conclusions.WINNER]
    for condition, fastest, _, runner, _, ratio, call in table:
        if fastest in conclusions.REFERENCES:
            inside = "inside" if call == conclusions.INSIDE else "beyond"
            assert f"{condition} ({fastest} {ratio} over {runner}, {inside} the noise)" in line
        if call == conclusions.WINNER:
            assert f"{condition}: {fastest} {ratio} over {runner}" in line
    if not winners:
        assert f"no winner beyond the noise in any of {len(table)}" in line
    # Stage F's afd/<layout> and pp/<layout> are one condition.
    parents = {tail.rsplit("/", 1)[0] for tail in cases} if stage != "stage_f" else {"pair"}
    assert len(table) == len(parents)
    assert len(winners) == {"stage_b": 1, "stage_e": 0, "stage_f": 1}[stage]
