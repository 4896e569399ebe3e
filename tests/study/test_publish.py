"""Known-answer tests of `study publish`: planted truth in, regions, effects and refusals out.

The planted study (tests/support/study_data.py): token_balanced ahead by x1.2
only above a realized imbalance of 0.3, no difference below, tested at
0, 0.1, 0.2, 0.4, 0.5, 0.6. Publication must put the boundary between 0.2
and 0.4, state x1.2 with an interval holding it, refuse a production
recommendation on reduced-layer CPU evidence, and exclude (naming the
field and both values) a result from another vLLM-Ascend commit.
"""

import csv
import hashlib
import json
import shutil

import pytest
from jsonschema import Draft202012Validator

from pytest_afd.results.documents import load_schema
from pytest_afd.study import effects, publish, regions
from pytest_afd.study.bundle_check import bundle_problems
from tests.support import study_data as sd

NO_PRODUCTION = "This bundle makes no production recommendation"
OTHER_COMMIT = "ffff999"


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """One published bundle of the planted study plus one result from another stack commit."""
    tmp = tmp_path_factory.mktemp("planted")
    manifest = sd.make_manifest()
    study = sd.freeze_study(tmp, manifest)
    results = tmp / "results"
    for doc in sd.planted_pairs(manifest=manifest):
        sd.write(results, doc)
    other = sd.make_case("stage_c/imbalance-0.50", "token_balanced", imbalance=0.5,
                         ratio=0.5, manifest=sd.make_manifest(vllm_ascend=OTHER_COMMIT),
                         session="session-other")
    other["case_id"] = "stage_c/other-commit/token_balanced"
    other_path = sd.write(tmp / "other", other)
    bundle = tmp / "bundle"
    code = publish.main([str(results), str(other_path), "--study", str(study),
                         "--output", str(bundle)])
    assert code == 0
    return {"bundle": bundle, "regions": json.loads((bundle / "regions.json").read_text()),
            "study": study, "results": results, "other": other_path}


def _series(doc):
    assert len(doc["series"]) == 1, [s["conditions"] for s in doc["series"]]
    return doc["series"][0]


def test_the_boundary_lies_between_the_tested_points_either_side_of_the_truth(planted):
    series = _series(planted["regions"])
    into_token_balanced = [b for b in series["boundaries"] if b["to_call"] == effects.TOKEN_BALANCED]
    assert [b["between"] for b in into_token_balanced] == [[0.2, 0.4]]
    calls_below = [p["call"] for r in series["regions"] for p in r["points"]
                   if p["realized_imbalance"] < sd.PLANTED_THRESHOLD]
    assert effects.TOKEN_BALANCED not in calls_below and effects.REQUEST_BOUNDARY not in calls_below


def test_the_region_above_states_the_planted_effect_with_an_interval_holding_it(planted):
    region = _series(planted["regions"])["regions"][-1]
    assert region["call"] == region["recommendation"] == effects.TOKEN_BALANCED
    assert region["conditions"]["realized_imbalance"] == {"low": 0.4, "high": 0.6}
    effect = region["effect"]["prefill_tokens_per_s"]
    assert effect["low"] <= sd.PLANTED_RATIO <= effect["high"]
    assert effect["ratio"] == pytest.approx(sd.PLANTED_RATIO, rel=0.03)
    # TTFT falls by the same factor (every request's TTFT scales with the run's wall time).
    ttft = region["effect"]["ttft_p50"]
    assert ttft["low"] <= 1 / sd.PLANTED_RATIO <= ttft["high"]
    assert sorted(region["cases"]) == sorted(
        f"stage_c/imbalance-{x:.2f}/{policy}" for x in (0.4, 0.5, 0.6)
        for policy in ("request_boundary", "token_balanced"))


def test_regions_below_the_truth_make_no_recommendation(planted):
    below = [r for r in _series(planted["regions"])["regions"]
             if r["conditions"]["realized_imbalance"]["high"] < sd.PLANTED_THRESHOLD]
    assert below and {r["recommendation"] for r in below} == {effects.NO_RECOMMENDATION}


def test_reduced_layer_evidence_refuses_a_production_recommendation_on_the_first_line(planted):
    doc, bundle = planted["regions"], planted["bundle"]
    assert doc["production_recommendation"] is False
    first_md = (bundle / "study.md").read_text().splitlines()[0]
    assert first_md == doc["headline"] and first_md.startswith(NO_PRODUCTION)
    assert "reduced layers in 12 of 12 cases" in first_md and "emulated on CPU" in first_md
    assert {r["label"] for s in doc["series"] for r in s["regions"]} == {regions.DIAGNOSTIC}
    page = (bundle / "study.html").read_text()
    body = page.split("<body>", 1)[1]
    assert body.lstrip().startswith('<p class="headline" role="note">' + NO_PRODUCTION)


def test_a_result_from_another_stack_commit_is_excluded_and_named(planted):
    doc = planted["regions"]
    (excluded,) = doc["excluded"]
    assert excluded["case_id"] == "stage_c/other-commit/token_balanced"
    assert {"field": "stack.vllm_ascend", "study_value": sd.STACK_COMMIT,
            "run_value": OTHER_COMMIT} in excluded["contradictions"]
    assert excluded["case_id"] not in doc["included_cases"]
    assert all(excluded["case_id"] not in r["cases"] for s in doc["series"] for r in s["regions"])
    named = [item for item in doc["limitations"] if item["kind"] == "excluded_contradicting_study"]
    assert len(named) == 1 and OTHER_COMMIT in named[0]["text"]
    assert "stack.vllm_ascend" in named[0]["text"]
    assert OTHER_COMMIT in (planted["bundle"] / "study.md").read_text()


def _csv(path):
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_regions_agree_with_the_bundles_own_tables(planted):
    bundle, doc = planted["bundle"], planted["regions"]
    points = _csv(bundle / "tables" / "points.csv")
    rows = {row["region"]: row for row in _csv(bundle / "tables" / "regions.csv")}
    regions_seen = [r for s in doc["series"] for r in s["regions"]]
    assert sorted(rows) == sorted(r["id"] for r in regions_seen)
    for region in regions_seen:
        row = rows[region["id"]]
        mine = [p for p in points if p["region"] == region["id"]]
        assert {p["call"] for p in mine} == {region["call"]} == {row["call"]}
        imbalances = [float(p["realized imbalance"]) for p in mine]
        assert float(row["imbalance low"]) == pytest.approx(min(imbalances), abs=1e-4)
        assert float(row["imbalance high"]) == pytest.approx(max(imbalances), abs=1e-4)
        effect = region["effect"]["prefill_tokens_per_s"]
        assert float(row["tokens/s ratio"]) == pytest.approx(effect["ratio"], abs=1e-4)
        assert float(row["tokens/s low"]) <= float(row["tokens/s ratio"]) <= float(row["tokens/s high"])
        assert sorted(row["cases"].split()) == region["cases"]
        for point, listed in zip(region["points"], mine, strict=True):
            assert float(listed["tokens/s ratio"]) == pytest.approx(
                point["prefill_tokens_per_s"]["ratio"], abs=1e-4)
    cases = _csv(bundle / "tables" / "cases.csv")
    assert sorted(c["case"] for c in cases) == doc["included_cases"]
    # The point's ratio is the cases table's medians' neighbourhood: recomputed from raw repetitions.
    for series in doc["series"]:
        for region in series["regions"]:
            for point in region["points"]:
                a, b = (json.loads(next(planted["results"].glob(
                    f"{case.replace('/', '_')}-*.json")).read_text())["metrics"][
                    "prefill_tokens_per_s"]["repetitions"] for case in point["cases"])
                assert effects.ratio_interval(a, b).ratio == pytest.approx(
                    point["prefill_tokens_per_s"]["ratio"])


def test_regions_json_matches_its_schema_and_a_broken_one_is_refused(planted):
    doc = planted["regions"]
    Draft202012Validator(load_schema("regions.schema.json")).validate(doc)
    broken = {**doc, "series": [{**doc["series"][0], "axis": "workload"}]}
    with pytest.raises(publish.PublishError, match=r"/series/0/axis"):
        publish.validate_regions(broken)


def test_raw_results_are_copied_byte_for_byte_and_every_file_has_its_digest(planted):
    bundle = planted["bundle"]
    listed = dict(reversed(line.split("  ", 1)) for line in
                  (bundle / "SHA256SUMS").read_text().splitlines())
    files = sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*")
                   if p.is_file() and p.name != "SHA256SUMS")
    assert sorted(listed) == files
    for name, digest in listed.items():
        assert hashlib.sha256((bundle / name).read_bytes()).hexdigest() == digest
    sources = sorted(hashlib.sha256(p.read_bytes()).hexdigest()
                     for p in [*planted["results"].glob("*.json"), planted["other"]])
    raw = sorted(digest for name, digest in listed.items() if name.startswith("raw/"))
    assert raw == sources
    assert (bundle / "study.json").read_bytes() == planted["study"].read_bytes()


def test_the_bundle_carries_the_per_stage_report_of_the_included_cases(planted):
    report = (planted["bundle"] / "report" / "report.md").read_text()
    assert "12 result(s) reported" in report and "other-commit" not in report
    assert "## stage_c" in report and list((planted["bundle"] / "report" / "plots").glob("*.png"))


def test_the_page_is_self_contained_and_has_print_rules(planted):
    page = (planted["bundle"] / "study.html").read_text()
    assert "@media print" in page and "@page" in page
    assert 'src="data:image/png;base64,' in page and 'src="plots/' not in page
    assert "<ul>" in page and "<li>reduced layers only" in page


def test_usage_errors_name_the_bad_input(planted, tmp_path, capsys):
    args = ["--study", str(planted["study"]), "--output"]
    assert publish.main([str(tmp_path / "nowhere"), *args, str(tmp_path / "b1")]) == 2
    assert "nowhere (RESULTS argument) does not exist" in capsys.readouterr().err
    assert publish.main([str(planted["results"]), *args, str(planted["bundle"])]) == 2
    assert "is not an empty directory" in capsys.readouterr().err
    edited = tmp_path / "edited.json"
    edited.write_text(planted["study"].read_text().replace('"planted"', '"renamed"'))
    assert publish.main([str(planted["results"]), "--study", str(edited), "--output",
                         str(tmp_path / "b2")]) == 2
    assert f"--study {edited}" in capsys.readouterr().err
    assert not (tmp_path / "b2").exists()


def test_the_bundle_agrees_with_itself_and_a_tampered_copy_is_caught(planted, tmp_path):
    assert bundle_problems(planted["bundle"]) == []
    copy = tmp_path / "copy"
    shutil.copytree(planted["bundle"], copy)
    table_path = copy / "tables" / "regions.csv"
    table_path.write_text(table_path.read_text().replace(",token_balanced,token_balanced,",
                                                         ",request_boundary,request_boundary,"))
    raw = sorted((copy / "raw").iterdir())[0]
    raw.write_bytes(raw.read_bytes() + b" ")
    problems = bundle_problems(copy)
    assert any("call 'request_boundary' != regions.json 'token_balanced'" in p for p in problems)
    assert f"raw/{raw.name}: sha256 differs from SHA256SUMS" in problems
    assert "tables/regions.csv: sha256 differs from SHA256SUMS" in problems
