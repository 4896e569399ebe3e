"""The nightly rehearsal's instrumented-step check (.ci/rehearse-nightly ``check_profiled``):
it passes results whose profile evidence is filled and names each field that is missing.

The filled profile is the real analysis of the ascend_pt fixtures (``profile-summary``),
so the check reads the fields as the analysis writes them.
"""

from __future__ import annotations

import copy
import importlib.machinery
import importlib.util
import json
from pathlib import Path

import pytest

from pytest_afd.__main__ import main
from pytest_afd.profiling import summary

pytest.importorskip("msprof_analyze", reason="msprof-analyze not installed (extra [profile])")

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).with_name("data")


def rehearsal_module():
    loader = importlib.machinery.SourceFileLoader("rehearse_nightly", str(REPO / ".ci" /
                                                                          "rehearse-nightly"))
    spec = importlib.util.spec_from_loader("rehearse_nightly", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fixture_profile(tmp_path_factory, fixture_analysis_session) -> dict:
    out = tmp_path_factory.mktemp("summary")
    with fixture_analysis_session.reusing():  # the session's real msprof-analyze output
        assert main(["profile-summary", f"attention={DATA / 'attention'}", str(DATA / "ffn"),
                     "--output", str(out)]) == 0
    profile = json.loads((out / summary.PROFILE_JSON).read_text())
    # The fixtures carry no expert load: the straggler rows a run's analysis adds beside it.
    profile["straggler"] = {"per_layer": [{"layer": 0, "straggler_s": 1e-4}],
                            "total_s": 1e-4, "expert_load_per_rank": [[3, 5]]}
    return profile


def write_results(folder: Path, profiles: list) -> Path:
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"kind": "afd-summary"}))
    for index, profile in enumerate(profiles):
        doc = {"kind": "afd-result", "case_id": f"stage_a::c{index}",
               "evidence": {"profile": profile}}
        (folder / f"c{index}.json").write_text(json.dumps(doc))
    return folder


def test_filled_profiles_pass(fixture_profile, tmp_path):
    module = rehearsal_module()
    results = write_results(tmp_path / "r", [fixture_profile, fixture_profile])
    assert module.check_profiled(results, "instrumented") == []


@pytest.mark.parametrize(("fault", "named"), [
    ("per_layer", "no per-layer rows"),
    ("per_step", "per-step overlap missing (0 steps)"),
    ("straggler", "no straggler figure"),
    ("collectives", "no collectives"),
    ("roles", "no utilization (busy_fraction) for ['attention', 'ffn']"),
])
def test_a_missing_field_is_named(fault, named, fixture_profile, tmp_path):
    module = rehearsal_module()
    broken = copy.deepcopy(fixture_profile)
    broken[fault] = [] if isinstance(broken[fault], list) else {}
    results = write_results(tmp_path / "r", [fixture_profile, broken])
    assert module.check_profiled(results, "instrumented") == [
        f"instrumented stage_a::c1: {named}"]


def test_absent_profile_and_no_results_are_named(tmp_path):
    module = rehearsal_module()
    absent = {"value": None, "absent_reason": "the case was not instrumented"}
    results = write_results(tmp_path / "r", [absent])
    assert module.check_profiled(results, "x") == [
        "x stage_a::c0: no profile evidence (the case was not instrumented)"]
    assert module.check_profiled(write_results(tmp_path / "e", []), "x") == [
        f"x: no result in {tmp_path / 'e'}"]


def test_an_absent_straggler_is_named(fixture_profile, tmp_path):
    """The FFN role emits no layer range on hardware: only the per-step figure counts."""
    module = rehearsal_module()
    broken = copy.deepcopy(fixture_profile)
    broken["straggler"]["total_s"] = {"value": None, "absent_reason": "one FFN rank"}
    results = write_results(tmp_path / "r", [broken])
    assert module.check_profiled(results, "x") == ["x stage_a::c0: no straggler figure"]
