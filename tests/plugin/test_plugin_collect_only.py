"""``pytest --co`` runs nothing, so it writes nothing: the last summary and every file stay."""

import json
import os

from pytest_afd.results.directory import STALE_TEMP_AGE_S

pytest_plugins = ["pytester"]
# A gate case: a session that selects no AFD case leaves the summary alone anyway.
GATE_CASE = "import pytest\n\n@pytest.mark.gate\ndef test_x():\n    pass\n"

def snapshot(directory):
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*")) if path.is_file()
    }


def test_collect_only_leaves_the_results_dir_alone(pytester):
    results = pytester.path / "res"
    pytester.makepyfile(test_x=GATE_CASE)
    pytester.runpytest("--afd-results-dir", str(results)).assert_outcomes(passed=1)
    summary = json.loads((results / "summary.json").read_text())
    # A killed write's temp file, old enough that a normal start-up would remove it.
    stale = results / ".case.json.abc123.tmp"
    stale.write_text("partial")
    old = stale.stat().st_mtime - 10 * STALE_TEMP_AGE_S
    os.utime(stale, (old, old))
    before = snapshot(results)

    result = pytester.runpytest("--co", "-q", "--afd-results-dir", str(results))
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*1 test collected*"])
    assert snapshot(results) == before
    assert json.loads((results / "summary.json").read_text()) == summary

    pytester.runpytest("--afd-results-dir", str(results)).assert_outcomes(passed=1)
    assert not stale.exists()  # a real run still cleans up and replaces the summary
    assert json.loads((results / "summary.json").read_text())["session_id"] != summary["session_id"]


def test_collect_only_into_a_new_dir_creates_nothing(pytester):
    results = pytester.path / "never"
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    assert pytester.runpytest("--collect-only", "--afd-results-dir", str(results)).ret == 0
    assert not results.exists()
