"""What `study publish` reads: study lineage, another study's results, unusable files, sessions pooled."""

import json

import pytest

from pytest_afd.results.manifest import manifest_digest
from pytest_afd.study import publish, regions
from pytest_afd.study.document import derive, load_study, write_study
from tests.support import study_data as sd

UNRELATED = "sha256:" + "0" * 64


def _recorded_under(manifest, name, digest):
    doc = {key: value for key, value in manifest.items() if key != "digest"}
    doc["study"] = {"name": name, "digest": digest}
    doc["digest"] = manifest_digest(doc)
    return doc


def test_results_of_an_ancestor_study_are_kept_and_another_studys_are_excluded(tmp_path):
    manifest = sd.make_manifest()
    frozen = load_study(sd.freeze_study(tmp_path, manifest))
    child = derive(frozen, name="with-references")
    child_path = write_study(child, tmp_path / "child.json")
    results = tmp_path / "results"
    under_parent = _recorded_under(manifest, frozen["name"], frozen["digest"])
    for doc in sd.planted_pairs(manifest=under_parent, imbalances=(0.5,)):
        sd.write(results, doc)
    stranger = sd.make_case("stage_c/stranger", "token_balanced", imbalance=0.5,
                            manifest=_recorded_under(manifest, "other", UNRELATED))
    sd.write(results, stranger)
    assert publish.main([str(results), "--study", str(child_path), "--output",
                         str(tmp_path / "bundle")]) == 0
    doc = json.loads((tmp_path / "bundle" / "regions.json").read_text())
    assert doc["included_cases"] == ["stage_c/imbalance-0.50/request_boundary",
                                     "stage_c/imbalance-0.50/token_balanced"]
    (excluded,) = doc["excluded"]
    assert excluded["case_id"] == "stage_c/stranger/token_balanced"
    assert excluded["contradictions"] == [{"field": "digest", "study_value": child["digest"],
                                           "run_value": UNRELATED}]


def test_unusable_files_are_listed_not_fatal(tmp_path):
    manifest = sd.make_manifest()
    study = sd.freeze_study(tmp_path, manifest)
    results = tmp_path / "results"
    for doc in sd.planted_pairs(manifest=manifest, imbalances=(0.5,)):
        sd.write(results, doc)
    (results / "broken.json").write_text('{"kind": "afd-result", "case_id": ')
    assert publish.main([str(results), "--study", str(study), "--output",
                         str(tmp_path / "bundle")]) == 0
    text = (tmp_path / "bundle" / "study.md").read_text()
    assert "1 unusable" in text and "broken.json" in text


def test_no_valid_result_is_a_usage_error(tmp_path, capsys):
    study = sd.freeze_study(tmp_path, sd.make_manifest())
    empty = tmp_path / "empty"
    empty.mkdir()
    assert publish.main([str(empty), "--study", str(study), "--output", str(tmp_path / "b")]) == 2
    assert f"no valid result under {empty}" in capsys.readouterr().err


def test_sessions_are_pooled_into_one_point():
    manifest = sd.make_manifest()
    docs = [*sd.planted_pairs(manifest=manifest, imbalances=(0.5,)),
            *sd.planted_pairs(manifest=manifest, imbalances=(0.5,), seed=1, session="session-2")]
    (point,) = regions.tested_points(docs)
    assert (point.throughput.n_a, point.throughput.n_b) == (10, 10)
    assert point.cases == sorted(d["case_id"] for d in docs)


def test_ttft_moving_against_throughput_leaves_the_point_undecided():
    manifest = sd.make_manifest()
    control, proposed = sd.planted_pairs(manifest=manifest, imbalances=(0.5,))
    slower_first_token = json.loads(json.dumps(proposed))
    for name in ("p50", "p90", "p95", "p99"):
        ttft = slower_first_token["metrics"]["ttft_s"][name]
        ttft["repetitions"] = [value * 2 for value in ttft["repetitions"]]
    (point,) = regions.tested_points([control, slower_first_token])
    assert point.throughput.ratio == pytest.approx(sd.PLANTED_RATIO, rel=0.05)
    assert point.call == "undecided" and "TTFT p50 moves against it" in point.reason


def test_an_earlier_bundle_and_a_repeated_file_are_not_read_twice(tmp_path):
    manifest = sd.make_manifest()
    study = sd.freeze_study(tmp_path, manifest)
    results = tmp_path / "results"
    paths = [sd.write(results, doc) for doc in sd.planted_pairs(manifest=manifest)]
    args = ["--study", str(study), "--output"]
    assert publish.main([str(results), *args, str(results / "bundle-1")]) == 0
    assert publish.main([str(results), str(paths[0]), *args, str(tmp_path / "bundle-2")]) == 0
    first, second = (json.loads((d / "regions.json").read_text())
                     for d in (results / "bundle-1", tmp_path / "bundle-2"))
    assert second["included_cases"] == first["included_cases"] and len(first["included_cases"]) == 12
    assert second["series"] == first["series"]


def test_a_gate_is_checked_on_the_stack_only(tmp_path):
    """A gate runs its own layouts and small models: another topology is its own, another commit is not."""
    manifest = sd.make_manifest()
    study = sd.freeze_study(tmp_path, manifest)
    results = tmp_path / "results"
    for doc in sd.planted_pairs(manifest=manifest, imbalances=(0.5,)):
        sd.write(results, doc)
    own_layout = sd.make_manifest(num_layers=2, topology="dp2tp4-ep8")
    other_commit = sd.make_manifest(num_layers=2, topology="dp2tp4-ep8", vllm_ascend="ffff999")
    for name, gate_manifest in (("own", own_layout), ("other", other_commit)):
        sd.write(results, sd.make_case(f"gate/{name}", "token_balanced", imbalance=0.0,
                                       kind="gate", manifest=gate_manifest))
    assert publish.main([str(results), "--study", str(study), "--output",
                         str(tmp_path / "bundle")]) == 0
    doc = json.loads((tmp_path / "bundle" / "regions.json").read_text())
    assert "gate/own/token_balanced" in doc["included_cases"]
    (excluded,) = doc["excluded"]
    assert excluded["case_id"] == "gate/other/token_balanced"
    assert [c["field"] for c in excluded["contradictions"]] == ["stack.vllm_ascend"]
