"""Result/manifest schemas, the build/validate/write API and atomic writes."""

import copy
import json
import os

import pytest

from pytest_afd.core.backend import RunSettings
from pytest_afd.results import documents as results
from pytest_afd.results.manifest import collect_manifest, manifest_digest
from pytest_afd.stats.repetitions import run_repeated
from pytest_afd.topology.spec import parse_topology
from tests.support.result_data import PROTOCOL, make_outputs


@pytest.fixture(scope="module")
def manifest():
    return collect_manifest(topology=parse_topology("dp3pcp8-ep8"), backend_name="cpu",
                            backend_description={"model": {"num_layers": 4}}, model_name="reduced",
                            protocol=PROTOCOL, emulated=True)


@pytest.fixture
def doc(manifest):
    outputs = make_outputs()
    run = run_repeated({"x": lambda: 1.0})
    return results.build_result(
        case_id="suite::case[bimodal]", case_kind="stage_a", backend="cpu",
        settings=RunSettings(split_align=1, pcp_size=8), manifest=manifest,
        workload=results.workload_json(dataset_name="bimodal", prompt_lengths=[100, 60, 40], seed=1),
        protocol=run.protocol_json(),
        metrics=results.metrics_from_runs([outputs, make_outputs(0.25), make_outputs(1.0)]),
        evidence=results.evidence_from_outputs(outputs, routing="natural", num_ep_ranks=4,
                                               requested_hit_ratio=0.1))


def test_plugin_manifest_is_valid_and_explicit_about_absent_fields(manifest):
    results.validate_manifest(manifest)
    assert manifest["digest"] == manifest_digest(manifest)
    software = manifest["software"]
    # Nothing NPU-specific exists here: each is recorded absent with a reason, not omitted.
    for key in ("driver_version", "firmware_version", "cann_version", "torch_npu_version"):
        assert results.is_absent(software[key]) and software[key]["absent_reason"]
    assert manifest["topology"]["cpu_emulation"]["pcp_size"] == 8
    assert manifest["topology"]["attention_ffn_ratio"] == 3.0
    assert manifest["model"]["num_layers"] == 4
    assert results.is_absent(manifest["model"]["tokenizer"])


def test_plugin_manifest_reads_ascend_install_info(tmp_path, manifest):
    toolkit = tmp_path / "toolkit" / "x86_64-linux"
    toolkit.mkdir(parents=True)
    (toolkit / "ascend_toolkit_install.info").write_text("package_name=cann\nversion=8.1.RC1\n")
    m = collect_manifest(topology=parse_topology("dp4pcp8"), backend_name="vllm-ascend",
                         backend_description=None, backend_absent_reason="no NPU", model_name="full",
                         protocol=PROTOCOL, emulated=False,
                         environ={"ASCEND_TOOLKIT_HOME": str(tmp_path / "toolkit"),
                                  "AFD_CONTAINER_DIGEST": "sha256:abc", "AFD_PLUGIN_COMMIT": "deadbeef"})
    results.validate_manifest(m)
    assert m["software"]["cann_version"] == "8.1.RC1"
    assert m["software"]["container_digest"] == "sha256:abc"
    assert m["software"]["afd_commit"] == "deadbeef"
    assert results.is_absent(m["topology"]["ffn"]) and results.is_absent(m["topology"]["cpu_emulation"])
    assert m["backend"]["description"]["absent_reason"] == "no NPU"
    assert m["digest"] != manifest["digest"]


def test_plugin_result_is_valid_and_derives_evidence(doc):
    results.validate_result(doc)
    evidence = doc["evidence"]
    assert evidence["tokens"] == {
        "logical_prompt_tokens": 200, "scheduled_real_tokens": 160, "padded_tokens": 16,
        "per_ubatch_real_tokens": [80, 80], "per_ubatch_padded_tokens": [0, 16], "max_imbalance": 0.0}
    assert evidence["prefix_cache"]["realized_hit_ratio"] == pytest.approx(0.1)
    assert evidence["expert_load"]["per_rank"] == [[3, 7, 11, 15]]
    assert results.is_absent(evidence["per_layer_timings"])
    metrics = doc["metrics"]
    assert metrics["completed_requests"] == 6 and metrics["failed_requests"] == 3
    # 160 completed logical tokens over 0.5 / 0.25 / 1.0 s
    assert metrics["prefill_tokens_per_s"]["repetitions"] == [320.0, 640.0, 160.0]
    assert metrics["prefill_tokens_per_s"]["stats"]["median"] == 320.0
    assert metrics["ttft_s"]["p50"]["stats"]["n"] == 3
    assert doc["labels"] == {"synthetic": False, "comparability": "comparable"}


@pytest.mark.parametrize(("field", "pointer"), results.RFC_FIELD_POINTERS)
def test_plugin_every_rfc_field_is_required(doc, field, pointer):
    broken = copy.deepcopy(doc)
    *parents, leaf = pointer.strip("/").split("/")
    node = broken
    for key in parents:
        node = node[key]
    del node[leaf]
    with pytest.raises(results.ResultValidationError, match=f"'{leaf}' is a required property"):
        results.validate_result(broken)


def test_plugin_forced_routing_must_be_labelled_synthetic(doc):
    doc["settings"]["expert_balancing"]["routing"] = "forced_balanced"
    with pytest.raises(results.ResultValidationError, match="/labels/synthetic"):
        results.validate_result(doc)
    doc["labels"]["synthetic"] = True
    results.validate_result(doc)


def test_plugin_bad_result_lists_each_error_path(doc):
    doc["metrics"]["ttft_s"] = {"p50": 1}
    doc["labels"]["comparability"] = "winner"
    doc["workload"]["request_count"] = -1
    with pytest.raises(results.ResultValidationError) as info:
        results.validate_result(doc)
    text = str(info.value)
    assert "at /labels/comparability: 'winner' is not one of" in text
    assert "at /metrics/ttft_s" in text and "'p90' is a required property" in text
    assert "at /workload/request_count" in text


def test_plugin_tampered_manifest_fails_digest_check(doc):
    doc["manifest"]["model"]["name"] = "full"
    with pytest.raises(results.ResultValidationError, match="does not match the embedded manifest"):
        results.validate_result(doc)


def test_plugin_write_result_round_trip(tmp_path, doc):
    path = results.write_result(results.result_path(tmp_path, doc["case_id"]), doc)
    assert path.name.startswith("suite_case_bimodal-") and path.suffix == ".json"
    assert results.read_result(path) == json.loads(json.dumps(doc))
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp files left


def test_plugin_invalid_result_does_not_touch_existing_file(tmp_path, doc):
    path = results.write_result(tmp_path / "case.json", doc)
    before = path.read_bytes()
    bad = copy.deepcopy(doc)
    del bad["evidence"]["steps"]
    with pytest.raises(results.ResultValidationError, match="'steps' is a required property"):
        results.write_result(path, bad)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["case.json"]


def test_plugin_atomic_write_keeps_old_file_when_serialization_fails(tmp_path):
    path = results.atomic_write_json(tmp_path / "x.json", {"a": 1})
    with pytest.raises(ValueError):
        results.atomic_write_json(path, {"a": float("nan")})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["x.json"]


def test_plugin_atomic_write_never_shows_a_torn_file(tmp_path):
    import threading

    path = tmp_path / "shared.json"
    results.atomic_write_json(path, {"n": -1, "pad": "x" * 200_000})
    stop = threading.Event()
    seen = []

    def reader():
        while not stop.is_set():
            seen.append(json.loads(path.read_text())["n"])  # raises on a partial file

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for n in range(40):
            results.atomic_write_json(path, {"n": n, "pad": "x" * 200_000})
    finally:
        stop.set()
        thread.join()
    assert seen and json.loads(path.read_text())["n"] == 39
    assert os.listdir(tmp_path) == ["shared.json"]


def test_plugin_result_path_is_unique_and_safe(tmp_path):
    a = results.result_path(tmp_path, "suites/x.py::t[a/b]")
    b = results.result_path(tmp_path, "suites/x.py::t[a_b]")
    assert a != b and "/" not in a.name and a.parent == tmp_path


def test_plugin_absent_needs_reason_and_expert_ranks_must_divide():
    with pytest.raises(ValueError, match="non-empty reason"):
        results.absent(" ")
    with pytest.raises(ValueError, match="8 experts cannot be spread evenly over 3 EP ranks"):
        results.per_rank_load([[1] * 8], 3)


def test_plugin_docs_map_every_rfc_field():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "plugin.md").read_text()
    missing = [pointer for _, pointer in results.RFC_FIELD_POINTERS if f"`{pointer}`" not in text]
    assert not missing, f"docs/plugin.md does not map {missing}"


def test_plugin_manifest_reads_npu_smi(tmp_path, monkeypatch):
    from pytest_afd.results import host_probe as manifest_module

    fake = tmp_path / "npu-smi"
    fake.write_text(
        "#!/bin/sh\n"
        "echo '        NPU ID                         : 0'\n"
        "echo '        Software Version               : 24.1.rc2'\n"
        "echo '        Firmware Version               : 7.5.0.1.129'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(manifest_module, "DRIVER_VERSION_FILE", tmp_path / "none.info")
    monkeypatch.setattr(manifest_module, "FIRMWARE_VERSION_FILE", tmp_path / "none.info")
    assert manifest_module.driver_version() == "24.1.rc2"
    assert manifest_module.firmware_version() == "7.5.0.1.129"
    (tmp_path / "version.info").write_text('Version="25.0.0"\n')
    monkeypatch.setattr(manifest_module, "DRIVER_VERSION_FILE", tmp_path / "version.info")
    assert manifest_module.driver_version() == "25.0.0"


def test_plugin_schemas_are_valid_2020_12_with_id_and_version():
    from jsonschema import Draft202012Validator

    from pytest_afd.results.manifest import MANIFEST_SCHEMA_VERSION

    for file_name, version in (("manifest.schema.json", MANIFEST_SCHEMA_VERSION),
                               ("result.schema.json", results.SCHEMA_VERSION)):
        schema = results.load_schema(file_name)
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"].startswith("urn:pytest-afd:schema:")
        assert schema["properties"]["schema_version"] == {"const": version}


def test_plugin_peak_memory_measured_only_when_every_run_reports_it():
    runs = [make_outputs(), make_outputs()]
    assert results.is_absent(results.metrics_from_runs(runs)["peak_memory_bytes"])
    runs[0].peak_memory_bytes, runs[1].peak_memory_bytes = 2_000, 3_000
    memory = results.metrics_from_runs(runs)["peak_memory_bytes"]
    assert memory["unit"] == "bytes" and memory["repetitions"] == [2_000.0, 3_000.0]
    runs[1].peak_memory_bytes = None
    assert results.is_absent(results.metrics_from_runs(runs)["peak_memory_bytes"])
