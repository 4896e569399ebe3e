"""A drifted seam never breaks the plugin (issue 29, item 4): fresh processes per seam,
load order and pinned branch.

Each case is a fresh Python process (forked by the ``fork_server`` fixture before any
afd_split, afd_plugin or vLLM module loads) over the stand-in tree of registration_standins.py
(afd-plugin main 2e4378f or release/v0.19.1rc1 2f4f462) in which ONE seam's header
differs from the pinned ones. vLLM calls general plugins first in every process, so the
hook is registered and then the plugin's modules load as a worker loads them (or they
were loaded before registration). The process then does what the runner does: its
``__init__`` validates (afd-plugin runs ``fail_if_unsupported_npu_afd_features`` from
``AFDNPUAttentionModelRunner.__init__``: it parses the connector's extra config, then
calls the async-MoE validator seam), the first forward imports the pipeline
module, and each step calls the planner. Checked: every import finishes, the drifted
module is left as the plugin built it, one error names the seam, the installed header
and the pinned commits, ``request`` runs the plugin's own functions, and
``token_balanced`` is refused naming the drifted seam.
"""

from __future__ import annotations

import json
import os

import pytest

from afd_split.hook.facts.pinned import (
    DISPATCH,
    EXTRA_INFO,
    FORWARD,
    PLANNER,
    SLICER,
    VALIDATOR,
    normalize_header,
    seams_for,
    variant_for_branch,
)
from tests.support.registration_standins import PROCESS_TIMEOUT_S, ROOT, write_tree

BRANCHES = ("main", "release/v0.19.1rc1")
SEAMS = (VALIDATOR, PLANNER, SLICER, DISPATCH, EXTRA_INFO, FORWARD)
MODULE_SEAMS = ({PLANNER, SLICER}, {DISPATCH, EXTRA_INFO})
"""Seams that share a module: a drift in one leaves the whole module unpatched."""

LOAD_ORDERS = {
    # An Attention worker: plugins registered (either order), the runner module (which
    # imports the connector and validation modules), the runner's __init__ validates, the
    # first forward imports the pipeline, then steps are planned.
    "afd_first": "plugin:afd,plugin:afd_split,import_runner,validate,import_forward,plan",
    "afd_split_first": "plugin:afd_split,plugin:afd,import_runner,validate,import_forward,plan",
    # The seam modules already loaded when the hook registers (patched at once), and the
    # hook registered twice (vLLM may load general plugins more than once).
    "modules_first": "import_validation,import_runner,import_forward,plugin:afd,"
                     "plugin:afd_split,plugin:afd_split,validate,plan",
    # The validation module alone first (an FFN-like import), the runner later.
    "validation_first": "plugin:afd_split,import_validation,plugin:afd,import_runner,"
                        "import_forward,validate,plan",
}


def drifted_header(key: str, branch: str) -> str:
    """The pinned header of ``key`` with one more keyword parameter (PR #203's validator
    grew ``attn_ranks_per_dp`` this way)."""
    header = normalize_header(variant_for_branch(key, branch).header)
    head, tail = header.rsplit(")", 1)
    if "**kwargs" in head:  # keep **kwargs last
        return head.replace(", **kwargs", ", drift_probe: int = 0, **kwargs") + ")" + tail
    return f"{head}, drift_probe: int = 0){tail}"

PROCESS_SCRIPT = r'''
import importlib, json, logging, sys
from types import SimpleNamespace

import numpy as np

branch, steps = sys.argv[1], sys.argv[2].split(",")
records = []


class Collect(logging.Handler):
    def emit(self, record):
        records.append([record.levelname, record.name, record.getMessage()])


logging.getLogger("afd_split").addHandler(Collect())
logging.getLogger("afd_split").setLevel(logging.DEBUG)
RUNNER = "afd_plugin.v1.worker.npu.attention_model_runner"
VALIDATION = "afd_plugin.compat.npu.feature_validation"
FORWARD = "afd_plugin.model_executor.models.npu.deepseek_v2_async_cam_forward"
CONNECTOR = "afd_plugin.connectors.npu.async_cam"
VALIDATOR_NAME = "_fail_if_unsupported_npu_async_moe_ubatching_features"
PLANNER_NAME = "_build_attention_metadata_with_async_moe_ubatches"
report = {"imports": [], "validate": {}, "plan": {}}


def outcome(call):
    try:
        return ["ok", repr(call())]
    except Exception as error:  # the refusal under test
        return [type(error).__name__, str(error)]


def vllm_config():
    text = SimpleNamespace(to_dict=lambda: {"index_topk": 2048})
    return SimpleNamespace(
        parallel_config=SimpleNamespace(decode_context_parallel_size=1,
                                        prefill_context_parallel_size=1, tensor_parallel_size=4,
                                        enable_dbo=False, data_parallel_rank=0),
        model_config=SimpleNamespace(hf_text_config=text, enforce_eager=True),
        speculative_config=None)


def validate(split):
    config = vllm_config()
    config.connector_extra_config = {"async_moe_ubatching": True, "async_moe_num_ubatches": 2,
                                     "async_moe_split": split}
    return sys.modules[VALIDATION].fail_if_unsupported_npu_afd_features(
        config, afd_config=SimpleNamespace(compute_gate_on_attention=True))


def plan(split):
    runner_module = sys.modules[RUNNER]
    runner = runner_module.AFDNPUAttentionModelRunner()
    runner.afd_async_extra_info = SimpleNamespace(async_moe_split=split)
    tokens = np.asarray([40, 7, 9], dtype=np.int64)
    kwargs = {"num_tokens": 56, "num_reqs": 3, "max_query_len": 40, "num_tokens_padded": 56,
              "num_reqs_padded": 3, "ubatch_slices": None, "logits_indices": None,
              "use_spec_decode": False, "for_cudagraph_capture": False,
              "num_scheduled_tokens": None, "num_scheduled_tokens_np": tokens,
              "cascade_attn_prefix_lens": None}
    method = runner._build_attention_metadata_with_async_moe_ubatches
    return method(**kwargs) if branch == "main" else method((), kwargs, kwargs)


for step in steps:
    if step.startswith("plugin:"):
        name = step.split(":", 1)[1]
        if name == "afd":
            import afd_plugin
            afd_plugin.register_afd()
        else:
            from afd_split.hook import install as hook
            hook.register()
    elif step.startswith("import_"):
        module = {"import_runner": RUNNER, "import_validation": VALIDATION,
                  "import_forward": FORWARD}[step]
        report["imports"].append([step, outcome(lambda: importlib.import_module(module).__name__)])
    elif step == "validate":
        report["validate"] = {split: outcome(lambda: validate(split))
                              for split in ("request", "token_balanced")}
    elif step == "plan":
        report["plan"] = {split: outcome(lambda: plan(split))
                          for split in ("request", "token_balanced")}
        report["calls"] = [call[0] for call in sys.modules[RUNNER].CALLS]

from afd_split.hook.facts.drift_guard import PATCH_MARKER
from afd_split.hook.facts.pinned import function_header

functions = {
    "validator": vars(sys.modules[VALIDATION])[VALIDATOR_NAME],
    "planner": vars(sys.modules[RUNNER].AFDNPUAttentionModelRunner)[PLANNER_NAME],
    "slicer": vars(sys.modules[RUNNER])["split_attn_metadata"],
    "dispatch": vars(sys.modules[CONNECTOR].CAMAsyncAFDConnector)["send_attn_output"],
    "extra_info": vars(sys.modules[CONNECTOR].CAMAsyncAFDConnector)["parse_extra_config"].__func__,
    "forward": vars(sys.modules[FORWARD])["run_async_moe_ubatch_afd_forward"],
}
report["seams"] = {key: [getattr(function, PATCH_MARKER, None), function_header(function)]
                   for key, function in functions.items()}
report["errors"] = [record for record in records if record[0] == "ERROR"]
print(json.dumps(report))
'''


def run_drifted(fork_server, tree, branch: str, steps: str) -> dict:
    """The script in a fresh process (forked by ``fork_server``: no afd_split, afd_plugin or
    vLLM module loaded; ``tree`` and the repository first on ``sys.path``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    done = fork_server.run(PROCESS_SCRIPT, [branch, steps], env=env, timeout=PROCESS_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def drifted_trees(tmp_path_factory):
    root = tmp_path_factory.mktemp("drift")
    return {(branch, key): write_tree(root / f"{branch.replace('/', '_')}_{key}", branch,
                                      with_torch_npu=True,
                                      header_overrides={key: drifted_header(key, branch)})
            for branch in BRANCHES for key in SEAMS}


SLOW_ORDERS = ("modules_first", "validation_first")
"""Run with ``-m slow`` (the full matrix is 40 fresh processes, ~70 s on 2 cores)."""


@pytest.mark.parametrize("order", [pytest.param(order, marks=pytest.mark.slow)
                                   if order in SLOW_ORDERS else order for order in LOAD_ORDERS])
@pytest.mark.parametrize("seam", SEAMS)
@pytest.mark.parametrize("branch", BRANCHES)
def test_a_drifted_seam_leaves_the_plugin_importable_and_refuses_token_balanced(
        fork_server, drifted_trees, branch, seam, order):
    report = run_drifted(fork_server, drifted_trees[branch, seam], branch, LOAD_ORDERS[order])
    # Every import of the plugin finished.
    assert all(result[0] == "ok" for _, result in report["imports"]), report["imports"]
    # The drifted seam is the plugin's own function; its module's other seams too.
    left_alone = next((keys for keys in MODULE_SEAMS if seam in keys), {seam})
    for key, (marker, header) in report["seams"].items():
        if key in left_alone:
            assert marker is None, key
        else:
            assert marker == key and header == variant_for_branch(key, branch).normalized_header
    assert report["seams"][seam][1] == normalize_header(drifted_header(seam, branch))
    # One error, naming the seam, the installed header and every pinned commit.
    assert len(report["errors"]) == 1, report["errors"]
    message = report["errors"][0][2]
    assert repr(seam) in message and "drift_probe" in message
    for pinned in seams_for(seam):
        assert f"{pinned.branch}@{pinned.commit[:12]}" in message
    # request runs exactly as the plugin alone.
    assert report["validate"]["request"] == ["ok", "None"]
    assert report["plan"]["request"] == ["ok", "'plugin-full'"]
    # token_balanced is refused naming the drifted seam, and no stage is ever built.
    validated, planned = report["validate"]["token_balanced"], report["plan"]["token_balanced"]
    assert planned[0] != "ok" or validated[0] != "ok"
    refusal = validated[1] if validated[0] != "ok" else planned[1]
    # Named by the seam, also when the validator's own module is the drifted one (the
    # connector's extra-config parser refuses before the plugin's validator runs; a
    # pipeline loaded after validation is refused by the planner).
    assert f"afd_plugin seam {seam!r} drifted" in refusal
    if seam == VALIDATOR:
        assert validated[0] == "PluginDriftError", validated
    if seam not in (PLANNER, SLICER):
        assert planned[0] == "PluginDriftError" and repr(seam) in planned[1]


@pytest.mark.parametrize("branch", BRANCHES)
def test_without_drift_token_balanced_is_planned_in_the_same_process(fork_server, tmp_path,
                                                                    branch):
    """The control: the same script over a pinned tree patches every seam, logs no error,
    accepts token_balanced at validation and goes on to plan (the stand-in tree has no
    ``vllm.distributed``, so the planner stops where it creates the runner's session)."""
    tree = write_tree(tmp_path / "pinned", branch, with_torch_npu=True)
    report = run_drifted(fork_server, tree, branch, LOAD_ORDERS["afd_first"])
    assert report["errors"] == []
    assert all(marker == key for key, (marker, _) in report["seams"].items())
    assert report["validate"]["token_balanced"] == ["ok", "None"]
    assert report["plan"]["token_balanced"] == ["ModuleNotFoundError",
                                                "No module named 'vllm.distributed'"]
    assert report["calls"] == ["plugin_planner", "full_build"]
