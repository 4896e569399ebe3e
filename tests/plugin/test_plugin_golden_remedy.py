"""A missing or corrupt golden names the command that fixes it in the phase the session is in.

In a ``check`` phase the references come from the record phase: rerunning the
check with ``--afd-update-golden`` cannot restore them (it failed the same way
in the issue), so the error names the record phase instead.
"""

import pytest

pytest_plugins = ["pytester"]

CORRUPTS_THEN_LOADS = """
from pytest_afd.golden.store import GoldenCorruptError, GoldenMissingError

def test_remedy(golden):
    golden.save("reference/case", [1.0, 2.0])
    data, _ = golden.paths("reference/case")
    data.write_bytes(data.read_bytes() + b"torn")
    messages = []
    for name in ("reference/case", "reference/absent"):
        try:
            golden.load(name)
        except (GoldenCorruptError, GoldenMissingError) as error:
            messages.append(str(error))
    open("messages.txt", "w").write("\\n".join(messages))
"""


@pytest.mark.parametrize(
    ("phase", "remedy", "not_named"),
    [
        ("check", "--afd-reference-phase record, against the reference deployment",
         "--afd-update-golden"),
        ("live", "--afd-update-golden", "--afd-reference-phase"),
    ],
)
def test_golden_errors_name_the_fix_for_the_phase(pytester, phase, remedy, not_named):
    pytester.makepyfile(test_remedy=CORRUPTS_THEN_LOADS)
    result = pytester.runpytest("--afd-reference-phase", phase,
                                "--afd-golden-dir", str(pytester.path / "refs"))
    result.assert_outcomes(passed=1)
    corrupt, missing = (pytester.path / "messages.txt").read_text().splitlines()
    assert "does not match the sidecar" in corrupt and "not found" in missing
    assert remedy in corrupt and remedy in missing
    assert not_named not in corrupt and not_named not in missing
