"""``pytest -m gate`` (or a stage marker) skips collecting tests/: sound only while no test
there carries a suite marker, and only for expressions no other case can match."""

from pathlib import Path

import pytest

from tests.support.suite_selection import needs_a_suite_marker, suite_marker_uses

TESTS_DIR = Path(__file__).parent


@pytest.mark.parametrize(("markexpr", "suites_only"), [
    ("gate", True),
    ("stage_d", True),
    ("gate and not slow", True),
    ("(gate or stage_b) and not npu", True),
    ("gate or slow", False),
    ("not gate", False),
    ("not slow", False),
    ("", False),
    ("npu(devices=2)", False),  # keyword arguments are not read: collect everything
    ("gate and", False),  # pytest rejects it itself, with its own message
])
def test_only_expressions_no_other_case_can_match_skip_tests(markexpr, suites_only):
    assert needs_a_suite_marker(markexpr) is suites_only


def test_no_test_under_tests_carries_a_suite_marker():
    uses = [use for path in sorted(TESTS_DIR.rglob("*.py")) for use in suite_marker_uses(path)]
    assert not uses, f"suite markers under tests/ (move the case to suites/): {uses}"


def test_the_scan_finds_a_suite_marker_in_every_form(tmp_path):
    seeded = tmp_path / "test_seeded.py"
    seeded.write_text("import pytest\n\n"
                      "pytestmark = [pytest.mark.stage_b]\n\n"
                      "@pytest.mark.gate\ndef test_a():\n    pass\n\n"
                      "def pytest_collection_modifyitems(items):\n"
                      "    items[0].add_marker('stage_d')\n")
    assert sorted(use.split(" ")[1] for use in suite_marker_uses(seeded)) == [
        "gate", "stage_b", "stage_d"]
