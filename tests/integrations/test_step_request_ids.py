"""Every hook step line carries the step's request ids (batch order) and schedule, so the
harness joins hardware lines to a case's prompts as it joins the CPU backend's.

token_balanced lines come from the planner patch on the pinned stand-ins (main 2e4378f,
release/v0.19.1rc1 2f4f462; ``request`` / ``none`` lines are checked in
test_evidence_only.py, PCP lines in test_hook_pcp.py). The runner's ids come from
``input_batch.req_ids`` (vLLM 0.19.1 ``gpu_input_batch.InputBatch``); the join must map a
burst that reached the server out of order back to the case's prompts.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from afd_split.engine.ascend import ASCEND_LAYOUTS
from afd_split.hook.facts.drift_guard import TOKEN_BALANCED_SPLIT
from afd_split.hook.facts.pinned import BRANCHES
from afd_split.hook.glue.step_facts import (
    REQUEST_IDS_ABSENT_FIELD,
    SCHEDULE_ABSENT_FIELD,
    runner_step_facts,
)
from afd_split.hook.install import install_deferred
from afd_split.hook.planning.engine_step import StepRanks
from afd_split.hook.planning.stages import HookSession, ascend_splitter
from afd_split.hook.planning.worker_evidence import EvidenceWriter
from pytest_afd.backends.vllm_ascend.request_join import SERVER_REQUESTS, join_requests
from tests.support.hook_standins import BLOCK_SIZE, ascend_common, call_planner

SCHEDULED = [40, 7, 9]
COMPUTED = [24, 0, 5]
CASE_IDS = ["case-a", "case-b", "case-c"]
# The burst reached the server as c, a, b: the engine's batch order, vLLM-decorated.
ENGINE_IDS = ["cmpl-case-c-0", "cmpl-case-a-0", "cmpl-case-b-0"]


def session_factory(evidence_dir):
    def new_session(runner) -> HookSession:
        return HookSession(ranks=StepRanks(global_rank=0), groups=[],
                           splitter=ascend_splitter(chunked_prefill=False),
                           writer=EvidenceWriter(evidence_dir, "attention-rank0"))

    return new_session


def token_balanced_line(seams, branch, input_batch_ids, evidence_dir) -> dict:
    install_deferred(new_session=session_factory(evidence_dir))
    runner = seams.runner_class()
    common, meta = ascend_common(ASCEND_LAYOUTS[0], SCHEDULED, COMPUTED)
    runner.afd_async_extra_info = SimpleNamespace(async_moe_split=TOKEN_BALANCED_SPLIT)
    runner.input_batch = SimpleNamespace(
        num_computed_tokens_cpu_tensor=common.num_computed_tokens_cpu.clone(), **input_batch_ids)
    runner.cache_config = SimpleNamespace(block_size=BLOCK_SIZE)
    runner.connector = SimpleNamespace()
    runner.common, runner.real_batch, runner.long_seq_metadata = common, meta, "full-batch"
    assert call_planner(runner, branch, SCHEDULED) == "full-metadata"
    return json.loads((evidence_dir / "attention-rank0.jsonl").read_text().splitlines()[0])


@pytest.mark.parametrize("branch", BRANCHES)
def test_token_balanced_lines_carry_ids_and_schedule(branch, standin_plugin, tmp_path):
    line = token_balanced_line(standin_plugin(branch), branch,
                               {"req_ids": [*ENGINE_IDS, None]}, tmp_path)
    assert line["is_split"]
    assert line["request_ids"] == ENGINE_IDS  # batch order, padding slots left out
    assert line["schedule"] == {"requests": [0, 1, 2], "num_scheduled_tokens": SCHEDULED,
                                "num_computed_tokens": COMPUTED, "num_tokens": sum(SCHEDULED)}


@pytest.mark.parametrize("branch", BRANCHES)
def test_a_runner_without_req_ids_says_the_ids_are_absent(branch, standin_plugin, tmp_path):
    line = token_balanced_line(standin_plugin(branch), branch, {}, tmp_path)
    assert "request_ids" not in line
    assert "has no req_ids" in line[REQUEST_IDS_ABSENT_FIELD]
    assert line["schedule"]["num_scheduled_tokens"] == SCHEDULED
    problems: list[str] = []
    join_requests([line], CASE_IDS, problems)  # never joined by position
    assert len(problems) == 1 and "request_ids" in problems[0]


def test_missing_ids_and_input_batch_are_named():
    short = runner_step_facts(SimpleNamespace(input_batch=SimpleNamespace(req_ids=["x"])),
                              np.array([3, 4]), np.array([0, 0]))
    assert "['x'] for 2 scheduled requests" in short[REQUEST_IDS_ABSENT_FIELD]
    bare = runner_step_facts(SimpleNamespace(), np.array([3]))
    assert "has no input_batch" in bare[REQUEST_IDS_ABSENT_FIELD]
    assert bare[SCHEDULE_ABSENT_FIELD] == bare[REQUEST_IDS_ABSENT_FIELD]


@pytest.mark.parametrize("branch", BRANCHES)
def test_the_harness_join_maps_an_out_of_order_burst_to_the_case(branch, standin_plugin,
                                                                 tmp_path):
    line = token_balanced_line(standin_plugin(branch), branch, {"req_ids": ENGINE_IDS}, tmp_path)
    problems: list[str] = []
    join_requests([line], CASE_IDS, problems)
    assert problems == []
    # batch position 0 is case-c (prompt 2), 1 is case-a (0), 2 is case-b (1)
    assert line["schedule"]["requests"] == [2, 0, 1]
    assert line["schedule"][SERVER_REQUESTS] == [0, 1, 2]
    # the boundary request is read against the joined prompt: case-c's 40-token prompt
    boundary = line["boundary_request"]
    assert CASE_IDS[line["schedule"]["requests"][boundary]] == "case-c"
