"""``afd-launch-plan --for-gates`` (issue 40, finding 2): the split deployment the gates run on
and gate 1's split-none reference, at the settings the gate cases ask for."""

import dataclasses
import json

import pytest

from pytest_afd.backends.vllm_ascend.deployments import launch_key
from pytest_afd.backends.vllm_ascend.launch import main
from pytest_afd.core.backend import RunSettings

NODES = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")  # two deployments of two nodes
COMMON = ["--npu-topology", "dp3pcp8-ep8", "--model", "/models/ds", "--devices-per-node", "16",
          "--nic-name", "eth0", "--for-gates"]


def plan_json(capsys, nodes=NODES):
    argv = [*COMMON, *(arg for node in nodes for arg in ("--node-address", node)), "--json"]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_the_two_deployments_carry_the_gate_cases_settings(capsys):
    doc = plan_json(capsys)
    entries = doc["AFD_ASCEND_DEPLOYMENTS"]
    # What a gate 1 case at the defaults asks for (gate_settings: RunSettings defaults,
    # 128-token pages), as the attach mode keys it.
    wanted = launch_key(RunSettings())
    assert [entry["settings"] for entry in entries] == [
        wanted, launch_key(dataclasses.replace(RunSettings(), split_policy="none"))]
    assert [entry["url"] for entry in entries] == ["http://10.0.0.1:8000", "http://10.0.0.3:8000"]
    plans = [item["plan"] for item in doc["deployments"]]
    assert [plan["split"] for plan in plans] == ["token_balanced", "none"]
    assert [plan["nodes"] for plan in plans] == [list(NODES[:2]), list(NODES[2:])]
    assert "gate_runs.needs" in doc["not_covered"]


def test_the_recipe_defaults_are_replaced(capsys):
    """--routing forced_balanced / --quantization w8a8 / --max-num-seqs 32 (the plain plan's
    defaults, on which every gate split-path case skips) give way to the gates' settings."""
    argv = [*COMMON, *(arg for node in NODES for arg in ("--node-address", node)),
            "--routing", "forced_balanced", "--max-num-seqs", "32", "--json"]
    assert main(argv) == 0
    settings = json.loads(capsys.readouterr().out)["AFD_ASCEND_DEPLOYMENTS"][0]["settings"]
    assert (settings["routing"], settings["quantization"], settings["max_num_seqs"]) == (
        "natural", "none", 8)


def test_text_mode_names_both_and_the_deployments_file(capsys):
    assert main([*COMMON, *(arg for node in NODES for arg in ("--node-address", node))]) == 0
    text = capsys.readouterr().out
    assert "deployment 1 of 2: gates: the split path (token_balanced)" in text
    assert "deployment 2 of 2: gate 1's split-none reference" in text
    assert "set AFD_ASCEND_DEPLOYMENTS to its path" in text


def test_too_few_nodes_for_two_deployments_is_an_error(capsys):
    with pytest.raises(SystemExit) as stopped:
        main([*COMMON, "--node-address", NODES[0], "--node-address", NODES[1]])
    assert stopped.value.code == 2
    assert "give 4 --node-address (the first 2 for the split deployment" in capsys.readouterr().err


def test_a_co_located_topology_is_refused(capsys):
    argv = ["--npu-topology", "dp4pcp8", "--model", "/m", "--devices-per-node", "16",
            "--node-address", "10.0.0.1", "--node-address", "10.0.0.2", "--for-gates"]
    with pytest.raises(SystemExit):
        main(argv)
    assert "the gates' split path runs on an AFD topology" in capsys.readouterr().err
