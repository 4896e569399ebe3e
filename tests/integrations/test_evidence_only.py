"""Evidence-only mode: ``request`` and ``none`` run exactly as the plugin alone, and record.

On stand-ins of the plugin's runner that decide ``request`` / ``none`` steps
themselves (evidence_only_standins.py, written from afd-plugin 2e4378f / 2f4f462),
the pinned connector and the async-MoE pipeline (hook_standins.py): the same batches
run through the plugin alone and through the plugin with the whole hook installed
(router, planner, slicer, dispatch and forward patches). Every object the plugin
builds, every call it makes and every output row must be identical; the hook's lines
must describe the plugin's own stages, with expert load from the dispatches.
"""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from afd_split.hook.facts.drift_guard import PATCH_MARKER
from afd_split.hook.facts.pinned import (
    BRANCHES,
    EXTRA_INFO_MODULE,
    FORWARD_MODULE,
    PLANNER,
    ROUTER,
    RUNNER_MODULE,
    variant_for_branch,
)
from afd_split.hook.glue.evidence_only import DISABLED_ATTRIBUTE, PLANNER_LABEL, observe
from afd_split.hook.install import install_deferred
from afd_split.hook.patches import router as router_patch
from afd_split.hook.patches.router import install_evidence_only
from afd_split.hook.planning.engine_step import StepRanks
from afd_split.hook.planning.stages import SESSION_ATTRIBUTE, HookSession
from afd_split.hook.planning.worker_evidence import EVIDENCE_DIR_ENV
from pytest_afd.backends.vllm_ascend.worker_evidence import read_new_records, with_worker_evidence
from pytest_afd.core.backend import RequestOutput, RunOutputs, RunSettings
from pytest_afd.results import documents as results
from pytest_afd.results.manifest import collect_manifest
from pytest_afd.topology.spec import parse_topology
from tests.support.evidence_only_standins import deciding_runner_source
from tests.support.hook_standins import (
    _load,
    register_standins,
    standin_connector_source,
    standin_forward_source,
)

NUM_LAYERS, FIRST_MOE_LAYER, HIDDEN = 4, 1, 8
NUM_EXPERTS, TOP_K, EXPERT_PER_RANK = 16, 2, 2
REQUEST = "request"
# (scheduled tokens per request, padded rows): a long head, many small requests, one
# request (the plugin's search returns no split), and a parent with padding rows.
BATCHES = (([40, 7, 9], 56), ([5, 6, 7, 8, 9, 10], 48), ([33], 33), ([12, 20, 3], 40))


def load_plugin(folder, branch: str, hooked: bool, monkeypatch, new_session=None):
    """Fresh runner, connector and pipeline modules of ``branch``; with ``hooked`` they are
    registered under the pinned names and the whole hook installed as registration does."""
    folder.mkdir(parents=True)
    runner = _load(folder / "attention_model_runner.py", deciding_runner_source(branch))
    connector = _load(folder / "async_cam.py", standin_connector_source(branch))
    forward = _load(folder / "deepseek_v2_async_cam_forward.py", standin_forward_source(branch))
    if hooked:
        register_standins(monkeypatch, {RUNNER_MODULE: runner, EXTRA_INFO_MODULE: connector,
                                        FORWARD_MODULE: forward}, slice_type=runner.UBatchSlice)
        install_deferred(new_session=new_session)
        runner_class = runner.AFDNPUAttentionModelRunner
        for key, name in ((ROUTER, "_build_attention_metadata"),
                          (PLANNER, "_build_attention_metadata_with_async_moe_ubatches")):
            assert getattr(vars(runner_class)[name], PATCH_MARKER) == key
    return SimpleNamespace(runner=runner, connector=connector, forward=forward)


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    made = []

    def build(branch, hooked, new_session=None):
        plugin = load_plugin(tmp_path / f"p{len(made)}", branch, hooked, monkeypatch,
                             new_session)
        made.append(plugin)
        return plugin

    yield build
    for plugin in made:
        for module in (plugin.runner, plugin.connector, plugin.forward):
            sys.modules.pop(module.__name__, None)


def session_factory(evidence_dir):
    def new_session(runner) -> HookSession:
        return HookSession.from_environment(
            {EVIDENCE_DIR_ENV: str(evidence_dir)}, ranks=StepRanks(global_rank=0), groups=[],
            splitter=None, num_layers=NUM_LAYERS)

    return new_session


def make_runner(plugin, split: str):
    runner = plugin.runner.AFDNPUAttentionModelRunner()
    runner.afd_async_extra_info = SimpleNamespace(async_moe_ubatching=split != "none",
                                                  async_moe_split=split,
                                                  async_moe_num_ubatches=2)
    runner.afd_config = SimpleNamespace(compute_gate_on_attention=True)
    runner.connector = plugin.connector.CAMAsyncAFDConnector(
        topk=TOP_K, num_routed_experts=NUM_EXPERTS, expert_per_rank=EXPERT_PER_RANK)
    runner.ubatch_slices = runner._afd_async_moe_ubatch_metadata = None  # as __init__ sets them
    return runner


class RowLayer:
    """A row-wise layer: output rows depend on their own row only (as attention stages'
    MoE layers do per token), so any stage cut gives the unsplit forward's rows."""

    def __init__(self, index: int) -> None:
        self.weight = torch.linspace(0.5, 1.5, HIDDEN) * (index + 1)

    def __call__(self, positions, hidden_states, residual):
        residual = hidden_states if residual is None else residual + hidden_states
        return torch.tanh(hidden_states * self.weight + positions[:, None]), residual


MODEL = SimpleNamespace(config=SimpleNamespace(first_k_dense_replace=FIRST_MOE_LAYER),
                        start_layer=0, end_layer=NUM_LAYERS,
                        layers=[RowLayer(i) for i in range(NUM_LAYERS)])


class Context:
    def __init__(self, layer_idx, stage_idx, total_tokens):
        self.metadata = SimpleNamespace(layer_idx=layer_idx, stage_idx=stage_idx,
                                        total_tokens=total_tokens)


def step_request_ids(seed: int, num_reqs: int) -> list[str]:
    """The engine's ids of a step's requests in batch order (vLLM's ``cmpl-<id>-<n>``)."""
    return [f"cmpl-s{seed}r{index}-0" for index in range(num_reqs)]


def step_computed(seed: int, num_reqs: int) -> list[int]:
    return [(seed + index) % 3 * 4 for index in range(num_reqs)]


def run_step(plugin, runner, scheduled, padded_rows, seed):
    """One step as the plugin runs it: the router, the forward (the async pipeline when the
    plugin split, else every layer on the whole batch) and each MoE layer's dispatch per
    stage. Returns everything the plugin produced and the routed ids dispatched."""
    generator = torch.Generator().manual_seed(seed)
    tokens = np.asarray(scheduled, dtype=np.int64)
    # The runner's persistent input batch (vLLM 0.19.1 gpu_input_batch.InputBatch): ids in
    # batch order, host computed tokens padded past the real requests.
    runner.input_batch = SimpleNamespace(
        req_ids=step_request_ids(seed, len(tokens)),
        num_computed_tokens_cpu_tensor=torch.tensor([*step_computed(seed, len(tokens)), 0, 0]))
    runner.common = {"rows": np.arange(padded_rows * 3).reshape(padded_rows, 3),
                     "requests": np.arange(len(tokens))}
    kwargs = {"num_tokens": int(tokens.sum()), "num_reqs": len(tokens),
              "max_query_len": int(tokens.max()), "num_tokens_padded": padded_rows,
              "num_reqs_padded": len(tokens), "ubatch_slices": None, "logits_indices": None,
              "use_spec_decode": False, "for_cudagraph_capture": False,
              "num_scheduled_tokens": None, "num_scheduled_tokens_np": tokens,
              "cascade_attn_prefix_lens": None}
    full = runner._build_attention_metadata(**kwargs)
    hidden = torch.randn(int(tokens.sum()), HIDDEN, generator=generator)
    positions = torch.arange(int(tokens.sum()), dtype=torch.float32)
    staged = runner._afd_async_moe_ubatch_metadata
    if staged is not None:
        output = plugin.forward.run_async_moe_ubatch_afd_forward(
            MODEL, hidden, None, positions, SimpleNamespace(), staged)
        token_slices = [s.token_slice for s in staged["ubatch_slices"]]
    else:
        output, residual = hidden, None
        for layer in MODEL.layers:
            output, residual = layer(positions, output, residual)
        output = (output, residual)
        token_slices = [slice(0, int(tokens.sum()))]
    dispatched = []
    for layer in range(FIRST_MOE_LAYER, NUM_LAYERS):
        for stage, rows in enumerate(token_slices):
            ids = torch.randint(0, NUM_EXPERTS, (rows.stop - rows.start, TOP_K),
                                generator=generator)
            runner.connector.send_attn_output(hidden[rows], Context(layer, stage,
                                                                    rows.stop - rows.start),
                                              topk_ids=ids)
            dispatched.append((layer, stage, ids))
    return {"full": full, "staged": staged, "pending": runner._afd_pending_metadata,
            "ubatch_slices": runner.ubatch_slices, "output": output}, dispatched


def assert_same(left, right, where=""):
    """Equal, bit for bit; the two plugin copies' UBatchSlice classes differ, so slices
    compare by their fields."""
    if hasattr(left, "request_slice"):
        assert type(left).__name__ == type(right).__name__, where
        left, right = (left.request_slice, left.token_slice), (right.request_slice,
                                                               right.token_slice)
    if isinstance(left, dict):
        assert left.keys() == right.keys(), where
        for key in left:
            assert_same(left[key], right[key], f"{where}/{key}")
    elif isinstance(left, list | tuple):
        assert type(left) is type(right) and len(left) == len(right), where
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_same(a, b, f"{where}[{index}]")
    elif isinstance(left, torch.Tensor):
        assert left.dtype == right.dtype and torch.equal(left, right), where
    elif isinstance(left, np.ndarray):
        assert left.dtype == right.dtype and np.array_equal(left, right), where
    else:
        assert left == right, where


def compare_with_and_without_hook(plugins, branch, split, evidence_dir):
    """The same batches through the plugin alone and hooked; asserts every produced object,
    call and output row equal; returns what the plugin decided per step and the plugins."""
    alone = plugins(branch, hooked=False)
    hooked = plugins(branch, hooked=True, new_session=session_factory(evidence_dir))
    alone_runner, hooked_runner = make_runner(alone, split), make_runner(hooked, split)
    plans = []
    for seed, (scheduled, padded) in enumerate(BATCHES):
        plain, plain_ids = run_step(alone, alone_runner, scheduled, padded, seed)
        observed, observed_ids = run_step(hooked, hooked_runner, scheduled, padded, seed)
        assert_same(plain, observed, f"step {seed}")
        assert_same(plain_ids, observed_ids, f"step {seed} dispatches")
        plans.append((scheduled, padded, plain["staged"], plain_ids))
    for module in ("runner", "connector", "forward"):
        assert_same(getattr(alone, module).CALLS, getattr(hooked, module).CALLS, module)
    return plans, alone


@pytest.mark.parametrize("split", [REQUEST, "none"])
@pytest.mark.parametrize("branch", BRANCHES)
def test_the_plugin_runs_bit_identical_with_the_evidence_only_hook(branch, split, plugins,
                                                                   tmp_path, monkeypatch):
    evidence_dir = tmp_path / "evidence"
    monkeypatch.setenv(EVIDENCE_DIR_ENV, str(evidence_dir))
    plans, alone = compare_with_and_without_hook(plugins, branch, split, evidence_dir)
    assert alone.runner.CALLS
    assert (split == REQUEST) == bool(alone.forward.CALLS)  # the pipeline ran for request only

    evidence = read_new_records(evidence_dir, {}, max_read_bytes=1 << 20)
    assert evidence.problems == [] and len(evidence.records) == len(BATCHES)
    for record, (scheduled, padded, staged, ids) in zip(evidence.records, plans, strict=True):
        assert record["planner"] == PLANNER_LABEL
        seed = len([r for r in evidence.records if r["step"] < record["step"]])
        assert record["request_ids"] == step_request_ids(seed, len(scheduled))
        assert record["schedule"] == {
            "requests": list(range(len(scheduled))), "num_scheduled_tokens": list(scheduled),
            "num_computed_tokens": step_computed(seed, len(scheduled)),
            "num_tokens": sum(scheduled)}
        assert record["policy"] == ("request_boundary" if split == REQUEST else "none")
        stages = [] if staged is None else staged["ubatch_slices"]
        if stages:  # the plugin's own stages, not a re-plan
            assert record["split_token"] == stages[1].token_slice.start
            assert [u["num_real_tokens"] for u in record["ubatches"]] == [
                s.num_tokens for s in stages]
            assert [u["num_padded_tokens"] for u in record["ubatches"]] == [0, 0]
        else:
            assert record["split_token"] is None and record["ubatches"] == [{
                "index": 0, "token_start": 0, "token_stop": sum(scheduled), "request_start": 0,
                "request_stop": len(scheduled), "num_real_tokens": sum(scheduled),
                "num_padded_tokens": padded - sum(scheduled), "num_rows": padded}]
            assert (record["fallback_reason"] is not None) == (split == REQUEST)
        expected = np.zeros((NUM_LAYERS, NUM_EXPERTS), np.int64)
        for layer, _, layer_ids in ids:
            expected[layer] += np.bincount(layer_ids.reshape(-1).numpy(), minlength=NUM_EXPERTS)
        assert record["expert_load"] == expected[FIRST_MOE_LAYER:].tolist()
        assert record["expert_load_per_stage_tokens"] == [
            (s.stop - s.start) * TOP_K * (NUM_LAYERS - FIRST_MOE_LAYER)
            for s in ([st.token_slice for st in stages] or [slice(0, sum(scheduled))])]


@pytest.mark.parametrize("split", [REQUEST, "none"])
def test_evidence_only_lines_make_a_schema_valid_result_with_step_evidence(split, plugins,
                                                                           tmp_path, monkeypatch):
    evidence_dir = tmp_path / "evidence"
    monkeypatch.setenv(EVIDENCE_DIR_ENV, str(evidence_dir))
    plugin = plugins("main", hooked=True, new_session=session_factory(evidence_dir))
    runner = make_runner(plugin, split)
    scheduled, padded = BATCHES[0]
    run_step(plugin, runner, scheduled, padded, 0)
    over_http = RunOutputs(requests=[RequestOutput("r0", sum(scheduled), 0, 1, ttft_s=0.1)],
                           wall_time_s=0.2)
    outputs = with_worker_evidence(over_http, read_new_records(evidence_dir, {},
                                                               max_read_bytes=1 << 20))
    policy = "request_boundary" if split == REQUEST else "none"
    topology = parse_topology("dp3pcp8-ep8")
    protocol = {"seed": 0, "warmups": 0, "repetitions": 1, "run_order": "interleaved",
                "instrumented": False, "routing": "natural"}
    doc = results.build_result(
        case_id="integrations::evidence_only", case_kind="stage_a", backend="vllm-ascend",
        settings=RunSettings(split_policy=policy),
        manifest=collect_manifest(topology=topology, backend_name="vllm-ascend",
                                  backend_description={"model": {"num_layers": NUM_LAYERS}},
                                  model_name="deepseek-v3.2", protocol=protocol, emulated=False),
        workload=results.workload_json(dataset_name="synthetic", prompt_lengths=[sum(scheduled)],
                                       seed=0),
        protocol=protocol, metrics=results.metrics_from_runs([outputs]),
        evidence=results.evidence_from_outputs(outputs, routing="natural",
                                               num_ep_ranks=topology.num_ep_ranks))
    results.validate_result(doc)
    tokens = doc["evidence"]["tokens"]
    assert tokens["scheduled_real_tokens"] == sum(scheduled)
    assert len(tokens["per_ubatch_real_tokens"]) == (2 if split == REQUEST else 1)
    assert not results.is_absent(doc["evidence"]["expert_load"])


@pytest.mark.parametrize("fault", ["stage_slices", "pending_metadata"])
def test_a_hook_that_changed_the_plugins_step_would_be_caught(fault, plugins, tmp_path,
                                                              monkeypatch):
    """Fault injection: an observer that rewrites what the plugin decided fails the check."""
    monkeypatch.setenv(EVIDENCE_DIR_ENV, str(tmp_path / "evidence"))
    honest = router_patch.observe

    def tampering(runner, values, *args, **kwargs):
        honest(runner, values, *args, **kwargs)
        staged = runner._afd_async_moe_ubatch_metadata
        if fault == "stage_slices" and staged is not None:
            staged["ubatch_slices"] = staged["ubatch_slices"][::-1]
        elif fault == "pending_metadata":
            runner._afd_pending_metadata = ("single", 0)

    monkeypatch.setattr(router_patch, "observe", tampering)  # what the wrapper calls
    with pytest.raises(AssertionError, match="step 0"):
        compare_with_and_without_hook(plugins, "main", REQUEST, tmp_path / "evidence")


def test_without_the_evidence_directory_the_router_only_delegates(plugins, monkeypatch):
    monkeypatch.delenv(EVIDENCE_DIR_ENV, raising=False)
    made = []
    plugin = plugins("main", hooked=True, new_session=lambda runner: made.append(runner))
    runner = make_runner(plugin, REQUEST)
    run_step(plugin, runner, *BATCHES[0], 0)
    assert made == [] and SESSION_ATTRIBUTE not in vars(runner)


def test_token_balanced_steps_are_left_to_the_planner_patch(tmp_path):
    runner = SimpleNamespace(afd_async_extra_info=SimpleNamespace(
        async_moe_ubatching=True, async_moe_split="token_balanced"))
    observe(runner, {"num_scheduled_tokens_np": np.array([4, 4])}, session_factory(tmp_path),
            lambda: REQUEST, environ={EVIDENCE_DIR_ENV: str(tmp_path)})
    assert SESSION_ATTRIBUTE not in vars(runner) and not list(tmp_path.iterdir())


def test_a_step_it_cannot_describe_is_an_unrecorded_line_and_the_case_names_it(plugins, tmp_path,
                                                                                monkeypatch):
    monkeypatch.setenv(EVIDENCE_DIR_ENV, str(tmp_path / "evidence"))
    plugin = plugins("main", hooked=True, new_session=session_factory(tmp_path / "evidence"))
    runner = make_runner(plugin, REQUEST)
    runner.afd_async_extra_info.async_moe_split = "token"  # PR #203's: no afd_split policy
    run_step(plugin, runner, *BATCHES[0], 0)
    evidence = read_new_records(tmp_path / "evidence", {}, max_read_bytes=1 << 20)
    assert evidence.records == []
    assert len(evidence.problems) == 1 and "'token' has no afd_split policy" in evidence.problems[0]
    outputs = with_worker_evidence(RunOutputs(requests=[]), evidence)
    assert outputs.steps == []


def test_an_evidence_failure_never_reaches_the_plugin(plugins, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(EVIDENCE_DIR_ENV, str(tmp_path))

    def broken_session(runner):
        raise OSError("disk full")

    plugin = plugins("main", hooked=True, new_session=broken_session)
    runner = make_runner(plugin, REQUEST)
    with caplog.at_level(logging.ERROR):
        produced, _ = run_step(plugin, runner, *BATCHES[0], 0)
        run_step(plugin, runner, *BATCHES[1], 1)
    assert produced["staged"] is not None  # the plugin's own split ran
    assert "disk full" in vars(runner)[DISABLED_ATTRIBUTE]
    assert sum("evidence-only recording stopped" in r.message for r in caplog.records) == 1


def test_a_drifted_router_is_left_unpatched(tmp_path, caplog):
    source = deciding_runner_source("main").replace(
        "def _build_attention_metadata(self, num_tokens: int,",
        "def _build_attention_metadata(self, num_stage_pads: int, num_tokens: int,", 1)
    runner = _load(tmp_path / "drifted_runner.py", source)
    try:
        original = vars(runner.AFDNPUAttentionModelRunner)["_build_attention_metadata"]
        with caplog.at_level(logging.WARNING):
            assert install_evidence_only(runner, session_factory(tmp_path),
                                         lambda: REQUEST) == "drifted"
        assert vars(runner.AFDNPUAttentionModelRunner)["_build_attention_metadata"] is original
        assert "evidence-only mode is off" in caplog.text and "drifted" in caplog.text
    finally:
        sys.modules.pop(runner.__name__, None)
    assert "num_stage_pads" in source and "num_stage_pads" not in variant_for_branch(
        ROUTER, "main").header
