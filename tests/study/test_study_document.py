"""The study file: schema, digest (known answer), derivation, and a hand edit caught."""

import hashlib
import json

import pytest

from pytest_afd.study import cli
from pytest_afd.study.document import (
    StudyError,
    belongs,
    derive,
    load_study,
    study_digest,
    write_study,
)
from tests.study.study_helpers import freeze


def test_study_digest_is_sha256_of_the_canonical_json_without_digest(tmp_path):
    study = freeze(tmp_path)
    body = {key: value for key, value in study.items() if key != "digest"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert study["digest"] == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert study_digest(study) == study["digest"]


def test_study_freeze_records_every_freeze_list_field(tmp_path):
    study = freeze(tmp_path, "--pp-reference", "pp4pcp8", "--chunk-semantics", "global",
                   "--cann", "8.1.RC1")
    assert study["topology"]["terminology"]["tp_sp_maps_to"] == "pcp"
    assert study["topology"]["nodes"] == 2  # 32 devices on 16-device nodes
    assert study["chunk_semantics"]["value"] == "global" and study["chunk_semantics"]["note"]
    assert "realized" in study["cache_hit"]["verification"]
    assert study["pp_reference"]["topology"] == "pp4pcp8"
    assert study["stack"]["cann"] == "8.1.RC1"
    # Not given and no manifest: absent with the reason, never invented.
    assert study["stack"]["vllm"]["value"] is None and "--vllm" in study["stack"]["vllm"][
        "absent_reason"]
    assert study["launch_commands"]["value"] is None
    assert study["tolerances"]["float32"] == {"kind": "close", "atol": 1e-5, "rtol": 1.3e-6,
                                              "topk": 0}
    assert study["references"] is None and study["parent_digest"] is None


def test_study_hand_edit_is_caught_naming_the_file_and_digests(tmp_path):
    freeze(tmp_path)
    path = tmp_path / "s.json"
    doc = json.loads(path.read_text())
    doc["stack"]["model"]["layers"] = 60
    path.write_text(json.dumps(doc))
    with pytest.raises(StudyError, match=rf"study {path}: field 'digest' is sha256:\w+ but the "
                                         r"content hashes to sha256:\w+: the file was edited"):
        load_study(path)
    assert cli.main(["verify", str(path)]) == 2


def test_study_schema_error_names_the_field(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"kind": "afd-study", "schema_version": 1}))
    with pytest.raises(StudyError, match=rf"study {path}: not a valid study .*'digest' is a "
                                         "required property"):
        load_study(path)
    path.write_text("{nope")
    with pytest.raises(StudyError, match=rf"study {path}: not JSON \(line 1"):
        load_study(path)


def test_study_change_is_a_new_study_with_its_parent(tmp_path):
    study = freeze(tmp_path)
    child = derive(study, name="s2")
    assert child["digest"] != study["digest"] and child["parent_digest"] == study["digest"]
    write_study(child, tmp_path / "s2.json")
    assert load_study(tmp_path / "s2.json") == child
    again = freeze(tmp_path, "--from-study", str(tmp_path / "s.json"), "--cann", "8.2",
                   name="s3")
    assert again["parent_digest"] == study["digest"] and again["stack"]["cann"] == "8.2"
    assert again["stack"]["model"] == study["stack"]["model"]
    grandchild = derive(child, name="s4")
    assert grandchild["lineage"] == [study["digest"], child["digest"]]
    assert belongs(grandchild, study["digest"]) and belongs(grandchild, grandchild["digest"])
    assert not belongs(study, child["digest"])


def test_study_freeze_takes_launch_commands_from_afd_launch_plan(tmp_path, capsys):
    from pytest_afd.backends.vllm_ascend.launch import main as launch_main

    plans = []
    for topology in ("dp3pcp8-ep8", "dp4pcp8"):
        assert launch_main(["--npu-topology", topology, "--model", "/models/v32",
                            "--devices-per-node", "32", "--node-address", "127.0.0.1",
                            "--json"]) == 0
        plans.append(tmp_path / f"{topology}.json")
        plans[-1].write_text(capsys.readouterr().out)
    study = freeze(tmp_path, *(f"--launch-plan={plan}" for plan in plans))
    commands = study["launch_commands"]
    assert set(commands) == {"attention", "ffn", "baseline"}
    assert "vllm serve /models/v32" in commands["attention"]
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert cli.main(["freeze", "--name", "x", "--output", str(tmp_path / "x.json"),
                     "--npu-topology", "dp4pcp8", "--devices-per-node", "8", "--checkpoint", "m",
                     "--launch-plan", str(bad)]) == 2
    assert f"--launch-plan {bad}: not an afd-launch-plan --json file" in capsys.readouterr().err


def test_study_freeze_refuses_missing_model_and_topology(tmp_path, capsys):
    assert cli.main(["freeze", "--name", "x", "--output", str(tmp_path / "x.json"),
                     "--npu-topology", "dp4pcp8", "--devices-per-node", "8"]) == 2
    assert "the study needs the model: --checkpoint" in capsys.readouterr().err
    assert cli.main(["freeze", "--name", "x", "--output", str(tmp_path / "x.json"),
                     "--npu-topology", "dp4zz8", "--checkpoint", "m"]) == 2
    assert "--npu-topology 'dp4zz8'" in capsys.readouterr().err
