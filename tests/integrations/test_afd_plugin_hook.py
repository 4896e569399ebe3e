"""The AFD-plugin hook: activation, rejection, pass-through and drift, on pinned stand-ins."""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import tomllib
import torch

from afd_split import SplitInvariantError
from afd_split.engine.ascend import ASCEND_LAYOUTS
from afd_split.hook import install as afd_plugin
from afd_split.hook.facts.drift_guard import PATCH_MARKER, TOKEN_BALANCED_SPLIT, installed_branch
from afd_split.hook.facts.pinned import (
    BRANCHES,
    PINNED_SEAMS,
    PLANNER,
    PR_203_SPLIT_VALUES,
    function_header,
    variant_for_branch,
)
from afd_split.hook.glue.runner import seams_of
from afd_split.hook.install import SeamImportHook, install_deferred
from afd_split.hook.patches.planner import PLANNER_PATCHES
from afd_split.hook.patches.slicer import make_slicer_patch
from afd_split.hook.patches.validator import make_validator_patch
from afd_split.hook.planning.engine_step import StepRanks
from afd_split.hook.planning.stages import (
    SESSION_ATTRIBUTE,
    HookSession,
    PlannedUBatchSlices,
    ascend_splitter,
)
from afd_split.hook.planning.worker_evidence import EvidenceWriter
from tests.support.hook_standins import BLOCK_SIZE, ascend_common, call_planner

ROOT = Path(__file__).resolve().parents[2]
SCHEDULED = [40, 7, 9]  # a long request: the request-boundary split cannot balance it
COMPUTED = [24, 0, 5]  # prefix-cache hits: the tail's boundary piece has cached context


def _session_factory(evidence_dir: Path | None, *, splitter=None):
    def new_session(runner) -> HookSession:
        writer = None if evidence_dir is None else EvidenceWriter(evidence_dir, "attention-rank0")
        return HookSession(ranks=StepRanks(global_rank=0), groups=[],
                           splitter=splitter or ascend_splitter(chunked_prefill=False),
                           writer=writer)

    return new_session


def _runner(seams, split: str, scheduled=SCHEDULED, computed=COMPUTED,
            layout=ASCEND_LAYOUTS[0]):
    runner = seams.runner_class()
    common, meta = ascend_common(layout, scheduled, computed)
    runner.afd_async_extra_info = SimpleNamespace(async_moe_split=split)
    # The runner's own host copy (padded past the real requests, as vLLM-Ascend pads).
    runner.input_batch = SimpleNamespace(
        num_computed_tokens_cpu_tensor=common.num_computed_tokens_cpu.clone())
    runner.cache_config = SimpleNamespace(block_size=BLOCK_SIZE)
    runner.connector = SimpleNamespace()  # the plugin's connector (the recorder's home)
    runner.common = common
    runner.real_batch = meta
    runner.long_seq_metadata = "full-batch"
    return runner


def _call_planner(runner, branch: str, scheduled=SCHEDULED):
    return call_planner(runner, branch, scheduled)


@pytest.mark.parametrize("branch", BRANCHES)
def test_patch_functions_carry_the_pinned_headers_exactly(branch, standin_plugin):
    seams = standin_plugin(branch)
    patched = {
        "validator": make_validator_patch(lambda *a, **k: None, lambda: "request"),
        "slicer": make_slicer_patch(lambda *a: None),
        "planner": PLANNER_PATCHES[branch](lambda *a: None, seams_of(seams.runner_module),
                                           _session_factory(None)),
    }
    originals = {
        "validator": vars(seams.validation_module)[
            "_fail_if_unsupported_npu_async_moe_ubatching_features"],
        "slicer": vars(seams.runner_module)["split_attn_metadata"],
        "planner": vars(seams.runner_class)["_build_attention_metadata_with_async_moe_ubatches"],
    }
    for key, function in patched.items():
        assert function_header(function) == variant_for_branch(key, branch).normalized_header
        assert getattr(function, PATCH_MARKER) == key
        assert inspect.signature(function) == inspect.signature(originals[key])


@pytest.mark.parametrize("layout", ASCEND_LAYOUTS, ids=lambda layout: layout.version)
@pytest.mark.parametrize("branch", BRANCHES)
def test_token_balanced_routes_planning_and_slicing_through_afd_split(branch, layout,
                                                                      standin_plugin, tmp_path):
    seams = standin_plugin(branch)
    install_deferred(new_session=_session_factory(tmp_path))
    runner = _runner(seams, TOKEN_BALANCED_SPLIT, layout=layout)
    assert _call_planner(runner, branch) == "full-metadata"
    calls = [name for name, *_ in seams.runner_module.CALLS]
    assert calls == ["full_build", "stage_build"]  # never the plugin's planner or slicer
    sidecar = runner._afd_async_moe_ubatch_metadata
    slices = sidecar["ubatch_slices"]
    assert isinstance(slices, PlannedUBatchSlices)
    plan = slices.plan
    assert plan.policy.value == TOKEN_BALANCED_SPLIT and plan.boundary_request == 0
    assert [s.token_slice for s in slices] == [u.token_slice for u in plan.ubatches]
    head, tail = sidecar["attn_metadata"]
    assert type(head) is type(runner.common) and head.num_reqs == 1 and tail.num_reqs == 3
    # The tail starts inside request 0: its computed tokens advance by the head's piece.
    assert tail.num_computed_tokens_cpu[0] == COMPUTED[0] + plan.head_tokens
    assert head.seq_lens_cpu[-1] == COMPUTED[0] + plan.head_tokens
    assert tail.attn_state.name != "PrefillNoCache"
    assert [head.num_input_tokens, tail.num_input_tokens] == [u.num_rows for u in plan.ubatches]
    stage_positions = torch.cat([head.positions[: head.num_actual_tokens],
                                 tail.positions[: tail.num_actual_tokens]])
    assert stage_positions.tolist() == runner.real_batch.positions.tolist()
    assert runner.long_seq_metadata == "full-batch"  # stage build's write was undone
    assert runner._afd_pending_metadata == ("afd-metadata", 2, sum(SCHEDULED))
    line = json.loads((tmp_path / "attention-rank0.jsonl").read_text().splitlines()[0])
    assert line["policy"] == TOKEN_BALANCED_SPLIT and line["split_token"] == plan.split_token
    assert [u["num_real_tokens"] for u in line["ubatches"]] == [
        u.num_real_tokens for u in plan.ubatches]


@pytest.mark.parametrize("branch", BRANCHES)
def test_other_split_values_run_the_plugin_unchanged(branch, standin_plugin):
    seams = standin_plugin(branch)
    install_deferred(new_session=_session_factory(None))
    runner = _runner(seams, "request")
    assert _call_planner(runner, branch) == "plugin-full"
    assert [name for name, *_ in seams.runner_module.CALLS] == ["plugin_planner"]
    assert SESSION_ATTRIBUTE not in vars(runner)
    plain = [SimpleNamespace(request_slice=slice(0, 1), token_slice=slice(0, 4))]
    assert seams.runner_module.split_attn_metadata(plain, runner.common, 0) == ["plugin-stage"]
    seams.validation_module._fail_if_unsupported_npu_async_moe_ubatching_features(
        None, None, num_ubatches=2, split="request")
    with pytest.raises(RuntimeError, match="only request-boundary split; got async_moe_split='token'"):
        seams.validation_module._fail_if_unsupported_npu_async_moe_ubatching_features(
            None, None, num_ubatches=2, split="token")


def _vllm_config(*, pcp=1, tp=4, eager=True, speculative=None, sparse=True, dbo=False):
    text_config = SimpleNamespace(to_dict=lambda: {"index_topk": 2048} if sparse else {})
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            decode_context_parallel_size=1, prefill_context_parallel_size=pcp,
            tensor_parallel_size=tp, enable_dbo=dbo, data_parallel_rank=0),
        model_config=SimpleNamespace(hf_text_config=text_config, enforce_eager=eager),
        speculative_config=speculative,
    )


def test_validator_accepts_token_balanced_on_a_supported_deployment(standin_plugin):
    seams = standin_plugin("main")
    install_deferred(new_session=_session_factory(None))
    validate = seams.validation_module._fail_if_unsupported_npu_async_moe_ubatching_features
    validate(_vllm_config(), SimpleNamespace(compute_gate_on_attention=True), num_ubatches=2,
             split=TOKEN_BALANCED_SPLIT)
    # The plugin's own checks still ran, with the request value.
    assert seams.validation_module.CALLS == [("validator", "request", 2)]


@pytest.mark.parametrize(("config", "gate", "stages", "reason"), [
    (_vllm_config(pcp=8), True, 2, "prefill_context_parallel_size=8 > 1"),
    (_vllm_config(eager=False), True, 2, "graph mode 'graph' is not supported"),
    (_vllm_config(speculative=SimpleNamespace(num_speculative_tokens=1)), True, 2,
     "speculative metadata"),
    (_vllm_config(sparse=False), True, 2, "attention builder 'AscendMLAMetadataBuilder'"),
    (_vllm_config(), False, 2, "compute_gate_on_attention"),
    (_vllm_config(dbo=True), True, 2, "native DBO"),
])
def test_validator_rejects_unsupported_token_balanced_deployments(standin_plugin, config, gate,
                                                                  stages, reason):
    seams = standin_plugin("main")
    install_deferred(new_session=_session_factory(None))
    validate = seams.validation_module._fail_if_unsupported_npu_async_moe_ubatching_features
    with pytest.raises(RuntimeError, match="async_moe_split='token_balanced' is unsupported") as err:
        validate(config, SimpleNamespace(compute_gate_on_attention=gate), num_ubatches=stages,
                 split=TOKEN_BALANCED_SPLIT)
    assert reason in str(err.value)


def test_validator_keeps_the_plugins_own_rejections(standin_plugin):
    seams = standin_plugin("main")
    install_deferred(new_session=_session_factory(None))
    validate = seams.validation_module._fail_if_unsupported_npu_async_moe_ubatching_features
    with pytest.raises(RuntimeError, match="exactly two stages"):
        validate(_vllm_config(), SimpleNamespace(compute_gate_on_attention=True),
                 num_ubatches=3, split=TOKEN_BALANCED_SPLIT)


def test_token_balanced_is_not_a_pr_203_value():
    assert TOKEN_BALANCED_SPLIT not in PR_203_SPLIT_VALUES


def test_metadata_that_breaks_an_invariant_fails_the_step(standin_plugin):
    """The per-step request-level check runs inside the hook's slicing (fault injected)."""
    seams = standin_plugin("main")
    install_deferred(new_session=_session_factory(None))
    runner = _runner(seams, TOKEN_BALANCED_SPLIT)
    runner.common._num_computed_tokens_cpu[1] += 1  # host copy disagrees with seq_lens
    with pytest.raises(SplitInvariantError):
        _call_planner(runner, "main")


def test_a_batch_that_cannot_split_runs_unsplit(standin_plugin, tmp_path):
    seams = standin_plugin("main")
    install_deferred(new_session=_session_factory(tmp_path))
    runner = _runner(seams, TOKEN_BALANCED_SPLIT, scheduled=[1], computed=[0])
    assert _call_planner(runner, "main", scheduled=[1]) == "full-metadata"
    assert runner._afd_async_moe_ubatch_metadata is None
    line = json.loads((tmp_path / "attention-rank0.jsonl").read_text())
    assert line["is_split"] is False and line["fallback_reason"]


def test_install_is_idempotent(standin_plugin):
    seams = standin_plugin("main")
    hook = install_deferred(new_session=_session_factory(None))
    patched = vars(seams.runner_class)["_build_attention_metadata_with_async_moe_ubatches"]
    assert install_deferred(new_session=_session_factory(None)) is hook
    assert vars(seams.runner_class)["_build_attention_metadata_with_async_moe_ubatches"] is patched
    assert sum(isinstance(finder, SeamImportHook) for finder in sys.meta_path) == 1


def test_a_drifted_seam_is_left_unpatched_and_refuses_token_balanced(standin_plugin, caplog):
    drifted = variant_for_branch(PLANNER, "main").header.replace(
        "use_spec_decode: bool", "use_spec_decode: bool, num_stage_pads: int")
    seams = standin_plugin("main", header_overrides={PLANNER: drifted})
    original = vars(seams.runner_class)["_build_attention_metadata_with_async_moe_ubatches"]
    install_deferred(new_session=_session_factory(None))
    assert vars(seams.runner_class)["_build_attention_metadata_with_async_moe_ubatches"] is original
    assert "_build_attention_metadata_with_async_moe_ubatches" in caplog.text
    validate = seams.validation_module._fail_if_unsupported_npu_async_moe_ubatching_features
    with pytest.raises(RuntimeError, match="afd_plugin seam 'planner' drifted"):
        validate(_vllm_config(), SimpleNamespace(compute_gate_on_attention=True),
                 num_ubatches=2, split=TOKEN_BALANCED_SPLIT)


@pytest.mark.skipif(importlib.util.find_spec("afd_plugin") is None,
                    reason="afd_plugin is not installed (needs vLLM-Ascend, torch-npu, CANN); "
                           "the pinned headers are compared with stand-ins instead")
def test_installed_afd_plugin_matches_a_pinned_variant():  # pragma: no cover - hardware images
    import importlib

    for seam in PINNED_SEAMS:
        owner = importlib.import_module(seam.module)
        for part in seam.qualname.split("."):
            owner = inspect.getattr_static(owner, part)
        headers = {s.normalized_header for s in PINNED_SEAMS if s.key == seam.key}
        assert function_header(owner) in headers, f"{seam.module}.{seam.qualname} drifted"
    # The installed plugin's own seams against the patch functions, by inspect.signature.
    from afd_split.hook.facts.pinned import RUNNER_MODULE, VALIDATION_MODULE
    from afd_split.hook.glue.runner import plugin_request_split

    seams = seams_of(importlib.import_module(RUNNER_MODULE))
    branch = installed_branch(PLANNER, vars(seams.runner_class)[
        "_build_attention_metadata_with_async_moe_ubatches"])
    validator = vars(importlib.import_module(VALIDATION_MODULE))[
        "_fail_if_unsupported_npu_async_moe_ubatching_features"]
    planner = vars(seams.runner_class)["_build_attention_metadata_with_async_moe_ubatches"]
    slicer = vars(seams.runner_module)["split_attn_metadata"]
    pairs = [(validator, make_validator_patch(validator, plugin_request_split)),
             (slicer, make_slicer_patch(slicer)),
             (planner, PLANNER_PATCHES[branch](planner, seams, _session_factory(None)))]
    for installed, patched in pairs:
        assert [(p.name, p.kind, p.default) for p in inspect.signature(installed).parameters.values()] == [
            (p.name, p.kind, p.default) for p in inspect.signature(patched).parameters.values()]
    # The facts the PCP path relies on, read from the installed bodies.
    from afd_split.hook.facts.forward_drift import forward_drift
    from afd_split.hook.facts.pcp_drift import pcp_seam_unavailable
    from afd_split.hook.facts.pinned import FORWARD_MODULE

    forward = vars(importlib.import_module(FORWARD_MODULE))["run_async_moe_ubatch_afd_forward"]
    assert forward_drift(forward) is None
    if branch == "release/v0.19.1rc1":
        assert pcp_seam_unavailable(seams.runner_class, branch) is None


def test_entry_point_is_declared_and_register_is_safe_without_afd_plugin():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins == {afd_plugin.PLUGIN_NAME: "afd_split.hook.install:register"}
    if importlib.util.find_spec("afd_plugin") is None:
        assert afd_plugin.register() is None  # nothing to patch; the validator stays upstream's


def test_hook_lines_round_trip_into_a_schema_valid_result(standin_plugin, tmp_path):
    from pytest_afd.backends.vllm_ascend.worker_evidence import (
        read_new_records,
        with_worker_evidence,
    )
    from pytest_afd.core.backend import RequestOutput, RunOutputs, RunSettings
    from pytest_afd.results import documents as results
    from pytest_afd.results.manifest import collect_manifest
    from pytest_afd.topology.spec import parse_topology

    seams = standin_plugin("main")
    install_deferred(new_session=_session_factory(tmp_path))
    runner = _runner(seams, TOKEN_BALANCED_SPLIT)
    for _ in range(2):
        _call_planner(runner, "main")
    evidence = read_new_records(tmp_path, {}, max_read_bytes=1 << 20)
    assert evidence.problems == [] and [r["step"] for r in evidence.records] == [0, 1]
    over_http = RunOutputs(requests=[RequestOutput("r0", sum(SCHEDULED), 0, 1, ttft_s=0.1)],
                           wall_time_s=0.2)
    outputs = with_worker_evidence(over_http, evidence)
    assert len(outputs.steps) == 2 and outputs.expert_load == []  # no top-k ids at this seam
    protocol = {"seed": 0, "warmups": 0, "repetitions": 1, "run_order": "interleaved",
                "instrumented": False, "routing": "natural"}
    topology = parse_topology("dp3pcp8-ep8")
    doc = results.build_result(
        case_id="integrations::hook_lines", case_kind="stage_a", backend="vllm-ascend",
        settings=RunSettings(split_policy="token_balanced"),
        manifest=collect_manifest(topology=topology, backend_name="vllm-ascend",
                                  backend_description={"model": {"num_layers": 61}},
                                  model_name="deepseek-v3.2", protocol=protocol,
                                  emulated=False),
        workload=results.workload_json(dataset_name="synthetic", prompt_lengths=[sum(SCHEDULED)],
                                       seed=0),
        protocol=protocol, metrics=results.metrics_from_runs([outputs]),
        evidence=results.evidence_from_outputs(outputs, routing="natural",
                                               num_ep_ranks=topology.num_ep_ranks))
    results.validate_result(doc)
    assert doc["evidence"]["tokens"]["per_ubatch_real_tokens"] == [
        2 * u["num_real_tokens"] for u in outputs.steps[0]["ubatches"]]
    assert results.is_absent(doc["evidence"]["expert_load"])
