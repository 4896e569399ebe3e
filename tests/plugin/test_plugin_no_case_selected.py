"""A session that selects no AFD case (``-m gates``, a typo) costs nothing: the results
directory keeps its summary and results, and the terminal names the markers that exist."""

import json

pytest_plugins = ["pytester"]

CASES = '''
import pytest

@pytest.mark.gate
def test_gate_case(afd_results):
    pass

@pytest.mark.stage_d
def test_stage_case():
    pass

def test_plain():
    pass
'''


def snapshot(directory):
    return {str(path.relative_to(directory)): path.read_bytes()
            for path in sorted(directory.rglob("*.json")) if path.is_file()}


def test_a_marker_typo_leaves_the_summary_and_names_the_markers(pytester):
    results = pytester.path / "res"
    pytester.makepyfile(test_cases=CASES)
    pytester.runpytest("-m", "gate", "--afd-results-dir", str(results)).assert_outcomes(passed=1)
    summary = json.loads((results / "summary.json").read_text())
    before = snapshot(results)

    typo = pytester.runpytest("-m", "gates", "--afd-results-dir", str(results))
    typo.assert_outcomes()  # nothing ran
    assert snapshot(results) == before
    typo.stdout.fnmatch_lines([
        "*pytest-afd: no AFD case selected*",
        f"afd: no gate or stage case ran (-m 'gates'); {results} was left as it was "
        "(summary.json not replaced)",
        "afd: did you mean -m gate?",
        "afd: markers:",
        "  gate: an RFC correctness gate*",
        "  stage_d: RFC Stage D: chunked prefill",
    ])  # fmt: skip

    # Only unmarked tests: still no AFD case, still untouched.
    pytester.runpytest("-k", "plain", "--afd-results-dir", str(results)).assert_outcomes(passed=1)
    assert snapshot(results) == before

    # A stage case that ran replaces the summary as before.
    pytester.runpytest("-m", "stage_d", "--afd-results-dir", str(results)).assert_outcomes(
        passed=1)
    assert json.loads((results / "summary.json").read_text())["session_id"] != (
        summary["session_id"])
