"""Limitations come from the evidence: each kind is planted in the results and must be named.

And the production gate: full-layer natural-routing NPU evidence gives a
production recommendation; take away any one of those and the first line
refuses it, naming what is missing.
"""

import pytest

from pytest_afd.study import effects, limitations, methodology, regions
from pytest_afd.study.limitations import derive_limitations, headline_line
from tests.support import study_data as sd

STUDY = {"protocol": {"repetitions": 3}}


@pytest.fixture(scope="module")
def reduced():
    return sd.make_manifest()


def _kinds(docs, **kwargs):
    kwargs.setdefault("pairs", len(regions.tested_points(docs)))
    return {item.kind: item for item in derive_limitations(docs, STUDY, **kwargs)}


def _pair(condition, manifest, **kwargs):
    return [sd.make_case(condition, policy, imbalance=0.5, manifest=manifest, **kwargs)
            for policy in ("request_boundary", "token_balanced")]


def test_reduced_layers_emulation_single_session_and_missing_stages_are_derived(reduced):
    found = _kinds(_pair("stage_c/x", reduced))
    assert "10 of the model's 61 layers" in found[limitations.REDUCED_LAYERS].text
    assert found[limitations.EMULATED].cases == ("stage_c/x/request_boundary",
                                                 "stage_c/x/token_balanced")
    assert "session-1" in found[limitations.SINGLE_SESSION].text
    assert "gate, stage_a, stage_b, stage_d, stage_e, stage_f" in found[limitations.MISSING_STAGE].text
    assert limitations.FORCED not in found and limitations.FEW_REPETITIONS not in found


def test_two_sessions_are_not_a_single_session(reduced):
    docs = _pair("stage_c/x", reduced) + _pair("stage_c/x", reduced, session="session-2")
    assert limitations.SINGLE_SESSION not in _kinds(docs)


def test_forced_routing_is_named_with_its_cases(reduced):
    forced = sd.make_manifest(routing="forced_balanced")
    found = _kinds(_pair("stage_c/forced", forced, routing="forced_balanced"))
    assert found[limitations.FORCED].cases == ("stage_c/forced/request_boundary",
                                               "stage_c/forced/token_balanced")


def test_too_few_repetitions_against_the_frozen_protocol(reduced):
    docs = _pair("stage_c/short", reduced, repetitions=2)
    found = _kinds(docs)
    assert "fewer than 3 measured repetitions" in found[limitations.FEW_REPETITIONS].text
    assert limitations.FEW_REPETITIONS not in {
        item.kind for item in derive_limitations(docs, {"protocol": {"repetitions": 2}}, pairs=1)}


def test_an_instrumented_case_is_left_out_of_the_regions_and_named(reduced):
    docs = _pair("stage_c/x", reduced)
    profiled = sd.make_case("stage_c/x", "token_balanced", imbalance=0.5, manifest=reduced,
                            instrument=True, ratio=3.0)
    points = regions.tested_points([*docs, profiled])
    assert [p.cases for p in points] == [["stage_c/x/request_boundary", "stage_c/x/token_balanced"]]
    assert points[0].throughput.ratio == pytest.approx(1.0, abs=0.05)
    found = _kinds([*docs, profiled])
    assert found[limitations.PROFILED].cases == ("stage_c/x/token_balanced",)
    rows = methodology.overhead_rows([*docs, profiled])
    assert rows == [["stage_c/x/token_balanced", pytest.approx(rows[0][1]), methodology.TWIN]]
    assert float(rows[0][1]) == pytest.approx(1 / 3.0, rel=0.1)


def test_a_recorded_profiler_overhead_and_schedule_reach_the_methodology(reduced):
    (control, proposed) = _pair("stage_c/x", reduced)
    proposed = sd.with_profile(proposed, ratio=1.25, schedule={
        "skip_first": 4, "wait": 0, "warmup": 1, "active": 5, "repeat": 1})
    lines = "\n".join(methodology.methodology_lines([control, proposed]))
    assert "Headline runs: 2 of 2 cases" in lines
    assert "| stage_c/x/token_balanced | 1.250 |" in lines
    assert "| 4 | 0 | 1 | 5 | 1 |" in lines


def test_failed_cases_are_left_out_and_named(reduced):
    docs = [*_pair("stage_c/x", reduced), *_pair("stage_c/y", reduced, status="failed")]
    assert [p.condition for p in regions.tested_points(docs)] == ["stage_c/x"]
    assert _kinds(docs)[limitations.NOT_PASSED].cases == ("stage_c/y/request_boundary",
                                                          "stage_c/y/token_balanced")


def test_no_pair_at_all_is_a_limitation(reduced):
    lone = [sd.make_case("stage_c/x", "token_balanced", imbalance=0.5, manifest=reduced)]
    assert limitations.NO_PAIRS in _kinds(lone, pairs=0)


def _production_manifest(**overrides):
    return sd.make_manifest(num_layers=overrides.pop("num_layers", 61),
                            emulated=overrides.pop("emulated", False), **overrides)


def test_full_layer_natural_npu_evidence_gives_a_production_recommendation():
    docs = sd.planted_pairs(manifest=_production_manifest())
    series = regions.all_series(regions.tested_points(docs))
    decided = [r for s in series for r in s["regions"] if r["call"] == effects.TOKEN_BALANCED]
    assert [r["label"] for r in decided] == [regions.PRODUCTION]
    assert headline_line(docs, len(decided)).startswith("Production recommendation")


@pytest.mark.parametrize(("manifest_overrides", "case_overrides", "named"), [
    ({"num_layers": 10}, {}, "reduced layers in 12 of 12 cases"),
    ({"routing": "forced_balanced"}, {"routing": "forced_balanced"}, "forced routing in 12 of 12"),
    ({"emulated": True}, {}, "emulated on CPU in 12 of 12"),
])
def test_without_any_one_production_condition_the_first_line_refuses(manifest_overrides,
                                                                    case_overrides, named):
    docs = sd.planted_pairs(manifest=_production_manifest(**manifest_overrides), **case_overrides)
    series = regions.all_series(regions.tested_points(docs))
    labels = {r["label"] for s in series for r in s["regions"]}
    assert labels == {regions.DIAGNOSTIC}
    line = headline_line(docs, 0)
    assert line.startswith("This bundle makes no production recommendation") and named in line


def test_gates_do_not_count_as_performance_evidence_but_a_failed_gate_is_named(reduced):
    docs = _pair("stage_c/x", reduced)
    gate = sd.make_case("gate_1/split", "token_balanced", imbalance=0.0, kind="gate",
                        repetitions=1, manifest=sd.make_manifest(num_layers=2), status="failed")
    found = _kinds([*docs, gate])
    assert "10 of the model's 61 layers" in found[limitations.REDUCED_LAYERS].text
    assert gate["case_id"] not in found[limitations.REDUCED_LAYERS].cases
    assert limitations.FEW_REPETITIONS not in found
    assert found[limitations.NOT_PASSED].cases == (gate["case_id"],)
    assert "in 2 of 2 cases" in headline_line([*docs, gate], 0)


def test_the_cpu_stand_in_of_a_deploy_command_is_named_apart_from_the_cpu_backend(reduced):
    """A case the harness's CPU server served for a deploy command is a CPU stand-in, said so."""
    served = {**reduced, "backend": {"name": "vllm-ascend", "description": {"mode": "deploy"}},
              "hardware": {**reduced["hardware"],
                           "device_type": "cpu (pytest-afd server standing in)"}}
    docs = _pair("stage_c/cpu", reduced) + _pair("stage_c/served", served)
    text = _kinds(docs)[limitations.EMULATED].text
    assert "emulated or CPU stand-in: all 4 cases ran on CPU" in text
    assert ("2 on the CPU backend; 2 on the pytest-afd CPU server standing in for the "
            "deployment, 2 of them started by the deploy command") in text
