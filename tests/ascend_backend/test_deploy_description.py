"""Deploy-command mode's session description (pytest_afd.backends.vllm_ascend.attach): the
command line that serves the results, and a layer count the harness cannot read here
recorded as learned from the deployment, which the study check defers to the result."""

import json
import sys

from pytest_afd.backends.vllm_ascend.attach import attach_or_deploy
from pytest_afd.results.stand_in import SERVED_LATER
from pytest_afd.study.check import RUN_ABSENT, Contradiction, served_later
from pytest_afd.topology.spec import parse_topology

COMMAND = f"{sys.executable} -m pytest_afd.cli deploy-cpu"


def _describe(tmp_path, model_path: str) -> dict:
    environ = {"AFD_ASCEND_DEPLOY_COMMAND": COMMAND, "AFD_DEVICES_PER_NODE": "16",
               "AFD_ASCEND_MODEL_PATH": model_path}
    _, description = attach_or_deploy(parse_topology("dp3pcp8-ep8"), "reduced", environ, tmp_path)
    return description


def test_deploy_description_records_the_command_line_and_defers_unreadable_layers(tmp_path):
    description = _describe(tmp_path, str(tmp_path / "missing-{model}"))
    assert description["mode"] == "deploy" and description["deploy_command"] == COMMAND
    layers = description["model"]["num_layers"]
    path = str(tmp_path / "missing-reduced")
    assert layers == {"value": None, "absent_reason": SERVED_LATER.format(path=path)}
    shown = RUN_ABSENT.format(reason=layers["absent_reason"])
    assert served_later(Contradiction("stack.model.layers", 10, shown))
    other = RUN_ABSENT.format(reason="the backend did not report the layer count")
    assert not served_later(Contradiction("stack.model.layers", 10, other))


def test_deploy_description_reads_layers_from_a_readable_checkpoint(tmp_path):
    checkpoint = tmp_path / "ckpt-reduced"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"num_hidden_layers": 10}))
    assert _describe(tmp_path, str(tmp_path / "ckpt-{model}"))["model"]["num_layers"] == 10
