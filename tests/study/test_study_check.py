"""contradictions(study, manifest): every frozen field caught with both values, nothing else."""

import dataclasses
import json

import pytest

from pytest_afd.golden.compare import PROFILES
from pytest_afd.study.check import SCOPE_STACK, Contradiction, contradictions, tolerance_table
from pytest_afd.study.document import derive
from tests.study.study_helpers import FULL_LAYERS, cpu_manifest, freeze

VLLM_ASCEND = "0.11.0rc1+git.abc"


def _fields(found):
    return {c.field: (c.study_value, c.run_value) for c in found}


def test_check_matching_runs_have_no_contradiction(tmp_path):
    study = freeze(tmp_path, "--pp-reference", "pp4pcp8")
    assert contradictions(study, cpu_manifest()) == []
    assert contradictions(study, cpu_manifest("full", FULL_LAYERS)) == []
    # Stage F: the study's PP reference layout is part of the study.
    assert contradictions(study, cpu_manifest(topology="pp4pcp8")) == []


def test_check_another_stack_commit_is_named_with_both_values(tmp_path):
    study = freeze(tmp_path, "--vllm-ascend", VLLM_ASCEND, "--afd-plugin", "deadbeef")
    run = cpu_manifest(environ={"AFD_PLUGIN_COMMIT": "cafef00d"})
    found = _fields(contradictions(study, run))
    assert found["stack.afd_plugin"] == ("deadbeef", "cafef00d")
    study_value, run_value = found["stack.vllm_ascend"]
    assert study_value == VLLM_ASCEND and run_value.startswith("<absent: vllm-ascend is not")
    assert set(found) == {"stack.afd_plugin", "stack.vllm_ascend"}
    assert Contradiction("f", 1, 2).describe() == "f: study 1, run 2"


def test_check_topology_nodes_and_devices(tmp_path):
    study = freeze(tmp_path)
    assert _fields(contradictions(study, cpu_manifest(topology="dp4pcp8"))) == {
        "topology.name": ("dp3pcp8-ep8", "dp4pcp8")}
    found = _fields(contradictions(study, cpu_manifest(devices_per_node=8)))
    assert found == {"topology.devices_per_node": (16, 8), "topology.nodes": (2, 4)}


def test_check_model_and_layers(tmp_path):
    study = freeze(tmp_path)
    assert _fields(contradictions(study, cpu_manifest("other"))) == {
        "stack.model.checkpoint": (["full", "reduced"], "other")}
    assert _fields(contradictions(study, cpu_manifest("full", 60))) == {
        "stack.model.layers": (FULL_LAYERS, 60)}
    assert _fields(contradictions(study, cpu_manifest("reduced", 2))) == {
        "stack.model.reduced.layers": (10, 2)}


def test_check_tolerances_of_another_harness(tmp_path):
    study = freeze(tmp_path)
    looser = {**study["tolerances"], "w8a8": {**study["tolerances"]["w8a8"], "atol": 0.5}}
    other = derive(study, tolerances=looser)
    found = _fields(contradictions(other, cpu_manifest()))
    assert found == {"tolerances.w8a8": (looser["w8a8"], tolerance_table()["w8a8"])}
    # A manifest that records its own tolerances is compared with those.
    manifest = {**cpu_manifest(), "tolerances": looser}
    assert contradictions(other, manifest) == []
    assert set(tolerance_table()) == set(PROFILES)


def test_check_absent_study_value_pins_nothing(tmp_path):
    study = freeze(tmp_path)  # vllm, torch_npu, ... absent: not given at freeze
    assert study["stack"]["vllm"]["value"] is None
    run = cpu_manifest()
    run["software"]["vllm_revision"] = "0.9.9"
    assert contradictions(study, run) == []
    assert dataclasses.is_dataclass(Contradiction) and Contradiction.__dataclass_params__.frozen


def test_check_gate_scope_is_the_stack_and_tolerances(tmp_path):
    study = freeze(tmp_path, "--afd-plugin", "deadbeef")
    gate = cpu_manifest("reduced:num_hidden_layers=2", 2, topology="dp2tp4-ep8",
                        environ={"AFD_PLUGIN_COMMIT": "deadbeef"})
    assert contradictions(study, gate, scope=SCOPE_STACK) == []
    assert {c.field for c in contradictions(study, gate)} == {"topology.name",
                                                              "stack.model.checkpoint"}
    other = cpu_manifest(topology="dp2tp4-ep8", environ={"AFD_PLUGIN_COMMIT": "cafef00d"})
    assert _fields(contradictions(study, other, scope=SCOPE_STACK)) == {
        "stack.afd_plugin": ("deadbeef", "cafef00d")}
    with pytest.raises(ValueError, match="scope='topology'"):
        contradictions(study, other, scope="topology")


def test_check_verify_cli_lists_contradicting_runs(tmp_path, capsys):
    from pytest_afd.study import cli

    freeze(tmp_path, "--afd-plugin", "deadbeef")
    runs = {}
    for name, commit in (("same", "deadbeef"), ("other", "cafef00d")):
        runs[name] = tmp_path / f"{name}.json"
        runs[name].write_text(json.dumps(cpu_manifest(environ={"AFD_PLUGIN_COMMIT": commit})))
    capsys.readouterr()
    study = str(tmp_path / "s.json")
    assert cli.main(["verify", study, "--manifest", str(runs["same"])]) == 0
    assert cli.main(["verify", study, "--manifest", str(runs["same"]), "--manifest",
                     str(runs["other"])]) == 1
    out = capsys.readouterr().out
    assert f"{runs['same']}: consistent" in out
    assert "stack.afd_plugin: study 'deadbeef', run 'cafef00d'" in out
