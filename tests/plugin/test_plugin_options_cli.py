"""Every ``--afd-*`` option is the plugin's: both CLI forms work, and a path value never moves the rootdir."""

from pathlib import Path

import pytest

from pytest_afd.run.early_setup import option_values
from pytest_afd.run.option_specs import OPTION_SPECS, value_flags

pytest_plugins = ["pytester"]

SUITES = Path(__file__).resolve().parents[2] / "suites"

OPTIONS_TEST = """
def test_values(afd_options):
    assert afd_options.stage_scale == 1 / 128
    assert afd_options.repeats == 4
    assert afd_options.topology.canonical == "dp4pcp8"
"""
GIVEN = {"--afd-stage-scale": "1/128", "--afd-repeats": "4", "--npu-topology": "dp4pcp8"}


@pytest.mark.parametrize("form", ["space", "equals"])
def test_value_options_work_space_separated_and_with_equals(pytester, form):
    pytester.makepyfile(test_opts=OPTIONS_TEST)
    args = []
    for flag, value in GIVEN.items():
        args += [flag, value] if form == "space" else [f"{flag}={value}"]
    result = pytester.runpytest(*args, "--afd-results-dir", str(pytester.path / "res"))
    result.assert_outcomes(passed=1)


def test_stage_scale_defaults_by_backend_and_reads_env_and_ini(pytester, monkeypatch):
    pytester.makepyfile(test_default="def test_d(afd_options):\n    assert afd_options.stage_scale == 1 / 64\n")
    pytester.runpytest().assert_outcomes(passed=1)
    pytester.makepyfile(test_default="def test_d(afd_options):\n    assert afd_options.stage_scale == 0.25\n")
    monkeypatch.setenv("AFD_STAGE_SCALE", "1/4")
    pytester.runpytest().assert_outcomes(passed=1)
    monkeypatch.delenv("AFD_STAGE_SCALE")
    pytester.makeini("[pytest]\nafd_stage_scale = 0.25\n")
    pytester.runpytest().assert_outcomes(passed=1)


@pytest.mark.parametrize("value", ["2", "0", "1/0", "half"])
def test_bad_stage_scale_is_a_usage_error_naming_the_flag(pytester, value):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("--afd-stage-scale", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--afd-stage-scale={value!r}: expected *"])


def test_no_suite_conftest_defines_options():
    """Options defined in a conftest are unknown to pytest's early parse (space form fails)."""
    offenders = [
        str(path.relative_to(SUITES)) for path in SUITES.rglob("*.py")
        if "addoption(" in path.read_text()
    ]
    assert offenders == []


def test_every_value_flag_is_known_to_the_early_value_scan():
    flags = value_flags()
    assert "--afd-golden-dir" in flags and "--afd-stage-scale" in flags
    assert "--afd-update-golden" not in flags  # a bool takes no value
    assert len(flags) == sum(spec.kind != "bool" for spec in OPTION_SPECS)
    assert option_values(["-q", "--afd-golden-dir", "/g", "--afd-seed=3", "x"], flags) == ["/g"]


SLOW_AND_FAST = """
import pytest

def test_fast():
    pass

@pytest.mark.slow
def test_slow():
    pass
"""


@pytest.mark.parametrize("form", ["space", "equals"])
def test_golden_dir_outside_the_repo_keeps_rootdir_and_ini(pytester, tmp_path_factory, form):
    """``--afd-golden-dir /elsewhere`` once made /elsewhere's ancestors the rootdir (ini dropped)."""
    outside = tmp_path_factory.mktemp("golden_elsewhere")
    pytester.makeini('[pytest]\naddopts = -m "not slow"\nmarkers =\n    slow: slow tests\n')
    pytester.makepyfile(test_mix=SLOW_AND_FAST)
    args = ["--afd-golden-dir", str(outside)] if form == "space" else [f"--afd-golden-dir={outside}"]
    result = pytester.runpytest("-v", *args, "--afd-results-dir", str(pytester.path / "res"))
    result.stdout.fnmatch_lines([f"rootdir: {pytester.path}", "test_mix.py::test_fast PASSED*"])
    result.assert_outcomes(passed=1, deselected=1)  # the ini's addopts applied


def test_a_moved_rootdir_that_cannot_be_repaired_is_a_usage_error(pytester, tmp_path_factory):
    """The value's directory has an ini file of its own: pytest already read it, so stop."""
    outside = tmp_path_factory.mktemp("golden_with_ini")
    (outside / "pytest.ini").write_text("[pytest]\n")
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("--afd-golden-dir", str(outside))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*read by pytest as test paths*write the option as --flag=value*"])


def test_docs_plugin_md_lists_every_option():
    from pytest_afd.golden import reference_phase

    docs = (Path(__file__).resolve().parents[2] / "docs" / "plugin.md").read_text()
    flags = [spec.flag for spec in OPTION_SPECS] + [reference_phase.FLAG]
    assert [flag for flag in flags if f"| `{flag}" not in docs] == []


SOAK_TEST = """
def test_soak_length(afd_options):
    assert afd_options.soak_forwards == {expected}
"""


@pytest.mark.parametrize(("args", "env", "expected"), [
    ((), None, 250), (("--afd-soak-forwards", "800"), None, 800), ((), "5000", 5000)])
def test_soak_forwards_reads_flag_and_env(pytester, monkeypatch, args, env, expected):
    if env is not None:
        monkeypatch.setenv("AFD_SOAK_FORWARDS", env)
    pytester.makepyfile(test_soak=SOAK_TEST.format(expected=expected))
    result = pytester.runpytest(*args, "--afd-results-dir", str(pytester.path / "res"))
    result.assert_outcomes(passed=1)


def test_a_soak_too_short_to_show_its_detectors_is_refused_by_name(pytester):
    pytester.makepyfile(test_soak=SOAK_TEST.format(expected=100))
    result = pytester.runpytest("--afd-soak-forwards", "100",
                                "--afd-results-dir", str(pytester.path / "res"))
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--afd-soak-forwards*100*"])
