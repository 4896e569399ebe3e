"""Structure of the CI workflows: YAML parses, triggers, required keys and the commands they run."""

import re
import shlex
from pathlib import Path

import pytest
import yaml

from pytest_afd.backends.vllm_ascend.backend import (
    ENV_MODEL_PATH,
    ENV_SERVER_SETTINGS,
    ENV_SERVER_URL,
)
from pytest_afd.backends.vllm_ascend.launch import LaunchOptions, build_launch_plan
from pytest_afd.backends.vllm_ascend.recipe import (
    CAM_WHEELS,
    PLUGIN_INSTALL_ARGS,
    PLUGIN_INSTALL_ENV,
)
from pytest_afd.plugin import MARKERS
from pytest_afd.topology.spec import parse_topology

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
NIGHTLY = WORKFLOWS / "nightly-ascend.yml"
CPU_CI = WORKFLOWS / "ci.yml"
CRON_FIELDS = 5
NODE_NPUS = 16


def load(path):
    doc = yaml.safe_load(path.read_text())
    # YAML 1.1 reads the bare key `on` as boolean True.
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def steps(job):
    return job["steps"]


def run_lines(job):
    return "\n".join(step.get("run", "") for step in steps(job))


def readme_commands():
    """The commands in the README's 'Run the tests' bash block, comments stripped."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Run the tests\s+```bash\n(.*?)```", text, re.S).group(1)
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


@pytest.mark.parametrize("path", [NIGHTLY, CPU_CI], ids=lambda p: p.name)
def test_every_step_is_well_formed(path):
    doc = load(path)
    assert doc["name"] and doc["jobs"] and doc["permissions"] == {"contents": "read"}
    for name, job in doc["jobs"].items():
        assert "runs-on" in job and "timeout-minutes" in job, name
        for step in steps(job):
            assert ("uses" in step) != ("run" in step), f"{name}: step needs exactly one of uses/run: {step}"
    text = path.read_text()
    assert text.count("${{") == text.count("}}"), "unbalanced ${{ }} expression"


def test_nightly_triggers_and_runner():
    doc = load(NIGHTLY)
    cron = doc["on"]["schedule"][0]["cron"]
    assert len(cron.split()) == CRON_FIELDS
    inputs = doc["on"]["workflow_dispatch"]["inputs"]
    assert {"npu_topology", "stage", "model", "image", "afd_plugin_ref", "server_url"} <= set(inputs)
    stage_markers = {name for name in MARKERS if name.startswith("stage_")}
    assert set(inputs["stage"]["options"]) == stage_markers
    job = doc["jobs"]["ascend"]
    # A repository variable, defaulting to vllm-ascend's own 16-NPU A3 nightly pool.
    assert job["runs-on"] == "${{ vars.AFD_ASCEND_RUNNER || 'linux-aarch64-nightly-a3-16' }}"
    # The container is the image job's digest-checked name@sha256 of a vllm-ascend tag.
    assert job["container"]["image"] == "${{ needs.image.outputs.image }}"
    assert job["needs"] == "image"
    image_step = doc["jobs"]["image"]["steps"][-1]
    assert "vllm-ascend" in image_step["env"]["IMAGE"]
    assert image_step["run"].startswith(".ci/check-image-digest")
    assert "/dev/davinci_manager" in job["container"]["options"]


def test_nightly_default_topology_launches_on_one_node():
    inputs = load(NIGHTLY)["on"]["workflow_dispatch"]["inputs"]
    topology = parse_topology(inputs["npu_topology"]["default"])
    assert topology.is_afd and topology.nodes_needed(NODE_NPUS) == 1
    plan = build_launch_plan(topology, LaunchOptions(model="/m", devices_per_node=NODE_NPUS,
                                                     node_addresses=("127.0.0.1",)))
    assert {process.node for process in plan.processes} == {0}
    # The recipe's PCP Attention layout, and the candidate phase's token_balanced split must be
    # launchable there (PCP on the default plugin ref's stack, v0.19.1rc1).
    assert topology.attention.size("pcp") > 1
    assert inputs["afd_plugin_ref"]["default"] == "release/v0.19.1rc1"
    build_launch_plan(topology, LaunchOptions(model="/m", devices_per_node=NODE_NPUS,
                                              node_addresses=("127.0.0.1",),
                                              split="token_balanced"))


def test_nightly_logs_stack_runs_gates_and_stage_and_uploads():
    job = load(NIGHTLY)["jobs"]["ascend"]
    script = run_lines(job)
    assert "npu-smi info" in script and "ascend_toolkit_install.info" in script
    commands = [shlex.split(line) for line in script.splitlines() if "python3 -m pytest " in line]
    reference, candidate, stage = (command[command.index("pytest") + 1:] for command in commands)
    for command in (reference, candidate, stage):
        assert command[command.index("--afd-backend") + 1] == "vllm-ascend"
        assert command[command.index("--npu-topology") + 1] == "$NPU_TOPOLOGY"
        assert "--afd-require-hardware" in command
    for command, phase in ((reference, "record"), (candidate, "check")):
        assert command[command.index("-m") + 1] == "gate"
        assert command[command.index("--afd-reference-phase") + 1] == phase
        assert command[command.index("--afd-golden-dir") + 1] == "$AFD_GOLDEN_DIR"
    assert reference[reference.index("--afd-results-dir") + 1] == "$AFD_REFERENCE_RESULTS_DIR"
    assert stage[stage.index("-m") + 1] == "$STAGE"
    assert "requirements-dev.txt" not in script.replace("Not requirements-dev.txt", "")
    env = job["env"]
    assert {ENV_MODEL_PATH, ENV_SERVER_URL, ENV_SERVER_SETTINGS} <= set(env)
    assert env["AFD_RESULTS_DIR"] == "afd-results"
    report = next(step for step in steps(job) if "pytest-afd report" in step.get("run", ""))
    upload = next(step for step in steps(job) if step.get("uses", "").startswith("actions/upload-artifact"))
    assert report["if"] == upload["if"] == "${{ always() }}"
    uploaded = {line.strip().rstrip("/") for line in upload["with"]["path"].splitlines()}
    assert uploaded == {"afd-results", env["AFD_REFERENCE_RESULTS_DIR"]}
    # Goldens, worker evidence and server logs (<results dir>/servers) all land in the upload.
    assert env["AFD_GOLDEN_DIR"].startswith("afd-results/")
    assert env["AFD_EVIDENCE_DIR"] == "${{ github.workspace }}/afd-results/evidence"


def step_named(job, words):
    return next(step for step in steps(job) if words in step["name"])


def test_nightly_installs_the_plugin_as_its_readme_says_after_the_compat_check():
    job = load(NIGHTLY)["jobs"]["ascend"]
    names = [step["name"] for step in steps(job)]
    install = step_named(job, "Install CAM operators and the AFD plugin")
    check = step_named(job, "Check the AFD plugin ref against the image")
    assert names.index(check["name"]) < names.index(install["name"])
    assert shlex.split(check["run"])[-2:] == ["pytest_afd.backends.vllm_ascend.compat", "afd-plugin"]
    plugin_install = [shlex.split(line) for line in install["run"].splitlines()
                      if line.strip().endswith("-e .")]
    assert len(plugin_install) == 1
    assert plugin_install[0][plugin_install[0].index("install") + 1:] == list(PLUGIN_INSTALL_ARGS)
    assert install["env"]["AFD_BUILD_ASCEND_OPS"] == PLUGIN_INSTALL_ENV["AFD_BUILD_ASCEND_OPS"]
    assert PLUGIN_INSTALL_ENV["SOC_VERSION"] in install["env"]["SOC_VERSION"]
    assert "vars.AFD_SOC_VERSION" in install["env"]["SOC_VERSION"]


def test_nightly_reference_phase_runs_before_the_candidate_and_can_attach_elsewhere():
    doc = load(NIGHTLY)
    job = doc["jobs"]["ascend"]
    names = [step["name"] for step in steps(job)]
    reference = step_named(job, "reference phase")
    candidate = step_named(job, "candidate phase")
    assert names.index(reference["name"]) < names.index(candidate["name"])
    assert "if" not in candidate  # a failed reference phase stops the candidate (no stale goldens)
    assert reference["env"][ENV_SERVER_URL] == "${{ inputs.reference_server_url }}"
    assert {"reference_server_url", "reference_server_settings"} <= set(
        doc["on"]["workflow_dispatch"]["inputs"])
    launch = step_named(job, "Launch plan")
    assert "--node-address 127.0.0.1" in launch["run"]


def test_compat_check_names_a_mismatched_plugin_ref(tmp_path):
    from pytest_afd.backends.vllm_ascend.compat import (
        IncompatiblePlugin,
        check_plugin_checkout,
        main,
    )

    wheel_dir = tmp_path / "afd_plugin" / "connectors" / "npu" / "bin"
    wheel_dir.mkdir(parents=True)
    (wheel_dir / CAM_WHEELS["release/v0.19.1rc1"]).write_text("")
    assert check_plugin_checkout(tmp_path, (3, 11)).endswith("cp311-cp311-linux_aarch64.whl")
    with pytest.raises(IncompatiblePlugin, match=r"for Python 3\.11, but this image runs Python 3\.12"):
        check_plugin_checkout(tmp_path, (3, 12))
    assert main([str(tmp_path / "missing")]) == 2


def test_cpu_workflow_runs_the_readme_commands():
    job = load(CPU_CI)["jobs"]["test"]
    runs = [step["run"].strip() for step in steps(job) if "run" in step]
    commands = readme_commands()
    assert commands == ["python3 -m pip install -r requirements-dev.txt",
                        "python3 -m pytest -n 2 --dist worksteal"]
    assert runs[: len(commands)] == commands
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci_run.splitlines()  # the test command exactly as written
    assert commands[0].split()[-1] in ci_run  # the setup (quiet there)
    on = load(CPU_CI)["on"]
    assert "pull_request" in on and "push" in on
