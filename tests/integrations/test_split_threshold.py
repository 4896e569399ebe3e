"""The hook's split threshold (``AFD_SPLIT_MIN_TOKENS``, issue 43): parsing, the exact
boundary, the evidence of an unsplit step, and the runner and PCP paths on stand-ins.

No timing: the threshold's default is checked against the NPU step model's arithmetic.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

from afd_split.engine.ascend import ASCEND_LAYOUTS
from afd_split.hook.facts.drift_guard import TOKEN_BALANCED_SPLIT
from afd_split.hook.install import install_deferred
from afd_split.hook.planning.engine_step import StepRanks, plan_engine_step
from afd_split.hook.planning.stages import (
    HookSession,
    PlannedUBatchSlices,
    ascend_splitter,
    plan_stages,
)
from afd_split.hook.planning.threshold import (
    DEFAULT_SPLIT_MIN_TOKENS,
    SPLIT_MIN_TOKENS_ENV,
    split_min_tokens,
)
from afd_split.hook.planning.worker_evidence import EVIDENCE_DIR_ENV
from afd_split.pcp.alignment import EngineAlignment
from afd_split.plan.constraints import SplitConstraints
from afd_split.plan.npu_step import RECIPE_NPU_STEP, RECIPE_STEP_TOKENS
from tests.support.hook_pcp_runner import RELEASE, pcp_runner, session_factory
from tests.support.hook_standins import BLOCK_SIZE, ascend_common, call_planner
from tests.support.split_threshold import SPLIT_EVERY_STEP

SCHEDULED = [40, 7, 9]
COMPUTED = [24, 0, 5]
TOTAL = sum(SCHEDULED)
HOST_COST_BOUND_S = 550e-6
"""The largest forced-split host cost per step engine_path_bench measured below 30K tokens
(docs/benchmarks.md), from which ``DEFAULT_SPLIT_MIN_TOKENS`` is derived."""
MAX_HOST_FRACTION = 0.01


def _slice(request_slice, token_slice):
    return request_slice, token_slice


def _session(**fields) -> HookSession:
    return HookSession(ranks=StepRanks(global_rank=0), groups=[], splitter=None, **fields)


def _plan(session, scheduled=SCHEDULED, computed=COMPUTED):
    return plan_stages(session, np.asarray(scheduled), num_computed_tokens=np.asarray(computed),
                       block_size=BLOCK_SIZE, slice_type=_slice)


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, DEFAULT_SPLIT_MIN_TOKENS),
    ({SPLIT_MIN_TOKENS_ENV: ""}, DEFAULT_SPLIT_MIN_TOKENS),
    ({SPLIT_MIN_TOKENS_ENV: "0"}, 0),
    ({SPLIT_MIN_TOKENS_ENV: "4096"}, 4096),
    ({SPLIT_MIN_TOKENS_ENV: " 512 "}, 512),
])
def test_the_setting_is_read_from_the_environment(environ, expected):
    assert split_min_tokens(environ) == expected


@pytest.mark.parametrize("bad", ["-1", "1.5", "16k", "abc", "1e4", "+5"])
def test_a_bad_setting_is_refused_naming_the_variable_its_value_and_source(bad):
    with pytest.raises(ValueError, match=re.escape(f"AFD_SPLIT_MIN_TOKENS={bad!r} (environment)")):
        split_min_tokens({SPLIT_MIN_TOKENS_ENV: bad})


def test_the_deployed_session_reads_the_setting_and_refuses_a_bad_one():
    def session(environ):
        return HookSession.from_environment(environ, ranks=StepRanks(global_rank=0), groups=[],
                                            splitter=None)

    assert session({}).min_split_tokens == DEFAULT_SPLIT_MIN_TOKENS
    assert session(SPLIT_EVERY_STEP).min_split_tokens == 0
    assert session({SPLIT_MIN_TOKENS_ENV: "2048"}).min_split_tokens == 2048
    with pytest.raises(ValueError, match="AFD_SPLIT_MIN_TOKENS='many'"):
        session({SPLIT_MIN_TOKENS_ENV: "many"})


def test_the_default_is_past_the_break_even_and_below_the_recipes_step():
    """Derivation (planning.threshold): a 550 us host cost is within 1% of the modelled NPU
    step from the default on, and the recipe's full steps are split."""
    assert RECIPE_NPU_STEP.step_s(DEFAULT_SPLIT_MIN_TOKENS) * MAX_HOST_FRACTION >= HOST_COST_BOUND_S
    assert DEFAULT_SPLIT_MIN_TOKENS < RECIPE_STEP_TOKENS


def test_the_boundary_is_exact_split_at_the_threshold_unsplit_one_below():
    constraints = SplitConstraints()
    at = plan_engine_step(SCHEDULED, policy=TOKEN_BALANCED_SPLIT, constraints=constraints,
                          num_computed_tokens=COMPUTED, min_split_tokens=TOTAL)
    above = plan_engine_step(SCHEDULED, policy=TOKEN_BALANCED_SPLIT, constraints=constraints,
                             num_computed_tokens=COMPUTED, min_split_tokens=TOTAL + 1)
    assert at.is_split and at.fallback_reason is None
    assert not above.is_split
    assert above.fallback_reason.startswith(
        f"below the split threshold: {TOTAL} scheduled tokens < {SPLIT_MIN_TOKENS_ENV}={TOTAL + 1}")
    assert above.policy.value == TOKEN_BALANCED_SPLIT
    assert [u.num_real_tokens for u in above.ubatches] == [TOTAL]


@pytest.mark.parametrize(("min_split_tokens", "splits"),
                         [(0, True), (TOTAL, True), (TOTAL + 1, False)])
def test_a_session_without_evidence_counts_the_step_and_leaves_it_unsplit(min_split_tokens,
                                                                          splits):
    session = _session(min_split_tokens=min_split_tokens)
    stages = _plan(session)
    assert isinstance(stages, PlannedUBatchSlices) is splits
    assert (stages is None) is not splits
    assert session.steps_planned == 1


def test_the_evidence_records_when_a_step_was_left_unsplit_and_why(tmp_path):
    session = HookSession.from_environment(
        {EVIDENCE_DIR_ENV: str(tmp_path), SPLIT_MIN_TOKENS_ENV: str(TOTAL + 1)},
        ranks=StepRanks(global_rank=0), groups=[], splitter=None)
    assert _plan(session) is None
    assert isinstance(_plan(session, [TOTAL + 1], [0]), PlannedUBatchSlices)
    below, at = (json.loads(line) for line in
                 (tmp_path / "attention-rank0.jsonl").read_text().splitlines())
    assert (below["step"], below["is_split"], below["policy"]) == (0, False, TOKEN_BALANCED_SPLIT)
    assert f"{TOTAL} scheduled tokens < {SPLIT_MIN_TOKENS_ENV}={TOTAL + 1}" in below[
        "fallback_reason"]
    assert (at["step"], at["is_split"], at["fallback_reason"]) == (1, True, None)


def _runner(seams, scheduled=SCHEDULED, computed=COMPUTED):
    runner = seams.runner_class()
    common, _ = ascend_common(ASCEND_LAYOUTS[0], scheduled, computed)
    runner.afd_async_extra_info = SimpleNamespace(async_moe_split=TOKEN_BALANCED_SPLIT)
    runner.input_batch = SimpleNamespace(
        num_computed_tokens_cpu_tensor=common.num_computed_tokens_cpu.clone())
    runner.cache_config = SimpleNamespace(block_size=BLOCK_SIZE)
    runner.connector = SimpleNamespace()
    runner.common = common
    runner.long_seq_metadata = "full-batch"
    return runner


@pytest.mark.parametrize(("environ", "splits"), [({}, False), (SPLIT_EVERY_STEP, True)])
def test_the_deployed_hook_builds_no_stage_below_the_threshold(standin_plugin, environ, splits):
    """Default threshold: a 56-token step is the plugin's full batch alone (no stage build,
    no guard); the gates' setting (0) splits it."""
    seams = standin_plugin("main")
    install_deferred(new_session=lambda runner: HookSession.from_environment(
        environ, ranks=StepRanks(global_rank=0), groups=[],
        splitter=ascend_splitter(chunked_prefill=False)))
    runner = _runner(seams)
    assert call_planner(runner, "main", SCHEDULED) == "full-metadata"
    calls = [name for name, *_ in seams.runner_module.CALLS]
    assert calls == (["full_build", "stage_build"] if splits else ["full_build"])
    assert (runner._afd_async_moe_ubatch_metadata is not None) is splits
    assert runner._afd_pending_metadata[1] == (2 if splits else None)


PCP = 4
PCP_SCHEDULED = [96, 40, 120, 64]
PCP_COMPUTED = [0, 32, 200, 16]


@pytest.mark.parametrize(("min_split_tokens", "splits"),
                         [(sum(PCP_SCHEDULED), True), (sum(PCP_SCHEDULED) + 1, False)])
@pytest.mark.parametrize("evidence", [False, True])
def test_the_pcp_path_compares_the_global_tokens(standin_plugin, tmp_path, min_split_tokens,
                                                  splits, evidence):
    """Under PCP the threshold is on the step's GLOBAL tokens (every PCP rank decides alike),
    not the rank's rows; below it the step line says why."""
    seams = standin_plugin(RELEASE)
    evidence_dir = tmp_path if evidence else None
    install_deferred(new_session=session_factory(
        evidence_dir, EngineAlignment(tp_size=1, sequence_parallel=False, pcp_size=PCP), 1,
        min_split_tokens=min_split_tokens))
    runner, batch = pcp_runner(seams, PCP_SCHEDULED, PCP_COMPUTED, PCP, 1)
    rank_rows = np.array(batch.rank_rows, dtype=np.int32)
    kwargs = {"num_tokens": int(rank_rows.sum()), "num_tokens_padded": int(rank_rows.sum()),
              "num_reqs": len(PCP_SCHEDULED), "num_scheduled_tokens_np": rank_rows,
              "ubatch_slices": None}
    assert runner._build_attention_metadata_with_async_moe_ubatches((), kwargs, kwargs) == (
        "full-metadata")
    assert (runner._afd_async_moe_ubatch_metadata is not None) is splits
    if evidence:
        line = json.loads((tmp_path / "attention-rank0.jsonl").read_text().splitlines()[0])
        assert line["is_split"] is splits
        assert (line["fallback_reason"] is None) is splits
        assert line["schedule"]["num_scheduled_tokens"] == PCP_SCHEDULED


def test_below_the_threshold_with_nothing_recording_the_runner_reads_nothing_else(
        standin_plugin):
    """The skip comes before the computed tokens are read: a runner without them runs the
    short step; the same runner with the threshold at 0 needs them."""
    seams = standin_plugin("main")
    threshold = {SPLIT_MIN_TOKENS_ENV: str(TOTAL + 1)}
    install_deferred(new_session=lambda runner: HookSession.from_environment(
        threshold, ranks=StepRanks(global_rank=0), groups=[],
        splitter=ascend_splitter(chunked_prefill=False)))
    runner = _runner_without_computed(seams)
    assert call_planner(runner, "main", SCHEDULED) == "full-metadata"
    assert runner._afd_async_moe_ubatch_metadata is None
    threshold[SPLIT_MIN_TOKENS_ENV] = "0"
    with pytest.raises(AttributeError, match="num_computed_tokens_cpu_tensor"):
        call_planner(_runner_without_computed(seams), "main", SCHEDULED)


def _runner_without_computed(seams):
    runner = _runner(seams)
    runner.input_batch = SimpleNamespace()  # no num_computed_tokens_cpu_tensor
    return runner
