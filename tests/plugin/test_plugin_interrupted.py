"""Interrupted is an outcome (issue 40, finding 5): a Ctrl-C says how many cases never ran.

The inner session's fifth case raises ``KeyboardInterrupt`` after writing its result,
which pytest handles exactly as a SIGINT arriving there (no timing involved).
"""

import json
from pathlib import Path

import pytest

from pytest_afd.report.rendering import render
from tests.support.plugin_pytester import FAST, run_fast

pytest_plugins = ["pytester"]

CASES = 17
STOPPED_AT = 4  # cases 0-3 finish; case 4 is running when the interrupt comes
INTERRUPTED_USER = f"""
import pytest

@pytest.mark.stage_d
@pytest.mark.parametrize("n", range({CASES}))
def test_case(record_case, n):
    record_case()
    if n == {STOPPED_AT}:
        raise KeyboardInterrupt

def test_pure_python():
    pass
"""
LINE = (f"interrupted: {CASES - STOPPED_AT} of {CASES} cases not run "
        f"(KeyboardInterrupt during test_interrupted.py::test_case[{STOPPED_AT}])")


def test_an_interrupted_session_says_how_many_cases_did_not_run(fake):
    fake.makepyfile(test_interrupted=INTERRUPTED_USER)
    result = fake.runpytest(*FAST, no_reraise_ctrlc=True)  # in process: pytester re-raises it
    assert result.ret == pytest.ExitCode.INTERRUPTED
    output = result.stdout.str()
    assert f"  {LINE}" in result.stdout.lines, output  # leads the verdicts
    row = next(line for line in result.stdout.lines
               if line.startswith(f"test_interrupted.py::test_case[{STOPPED_AT}]"))
    assert " interrupted " in row and "unknown" not in row
    assert "the test did not finish" not in output

    results_dir = fake.path / "afd-results"
    summary = json.loads((results_dir / "summary.json").read_text())
    stopped = summary["interrupted"]
    assert stopped["line"] == LINE
    assert (stopped["cases_selected"], stopped["cases_not_run"]) == (CASES, CASES - STOPPED_AT)
    assert stopped["not_run"][0] == f"test_interrupted.py::test_case[{STOPPED_AT}]"
    running = next(entry for entry in summary["results"]
                   if entry["nodeid"].endswith(f"[{STOPPED_AT}]"))
    assert running["outcome_reason"].startswith("interrupted: the session was interrupted")
    result_file = json.loads(Path(running["path"]).read_text())
    assert result_file["outcome"]["reason"].startswith("interrupted:")

    report = render(results_dir).read_text()
    assert LINE in report
    assert "the test did not finish" not in report


def test_an_uninterrupted_session_has_no_interrupted_entry(fake):
    fake.makepyfile(test_whole="""
import pytest

@pytest.mark.stage_d
def test_case(record_case):
    record_case()
""")
    result = run_fast(fake)
    assert result.ret == 0
    assert "interrupted" not in json.loads(
        (fake.path / "afd-results" / "summary.json").read_text())
    assert "interrupted:" not in result.stdout.str()
