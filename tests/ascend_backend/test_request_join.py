"""Step lines join to a case's prompts by request id, whatever order the server saw them in."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pytest_afd.backends import create_backend
from pytest_afd.backends.vllm_ascend.request_join import id_pattern, join_requests, prompt_index
from pytest_afd.backends.vllm_ascend.worker_evidence import WorkerEvidenceBackend
from pytest_afd.core.backend import PromptRequest, RunOutputs, RunSettings
from suites.gates.gate_evidence import final_chunk_tokens, split_steps

SMALL_MODEL = "reduced:num_hidden_layers=2,first_k_dense_replace=1"
LENGTHS = (40, 300, 150, 90)
SETTINGS = RunSettings(split_policy="token_balanced", chunk_size=128, max_num_batched_tokens=256,
                       split_align=1, pcp_size=1)


class ArrivalOrderServer:
    """The harness's server as the client sees it: the burst arrives in another order, and
    the server names each request ``<X-Request-Id>#<nonce>`` (serving/handler.py)."""

    name = "server-double"
    capabilities = frozenset()

    def __init__(self, backend, arrival: list[int]) -> None:
        self.backend, self.arrival = backend, arrival

    def run(self, prompts, settings):
        served = [PromptRequest(f"{prompts[i].request_id}#0a1b2c3d", prompts[i].prompt_token_ids)
                  for i in self.arrival]
        outputs = self.backend.run(served, settings)
        by_client = {self.arrival[k]: output for k, output in enumerate(outputs.requests)}
        return RunOutputs(requests=[by_client[i] for i in range(len(prompts))],
                          steps_absent_reason="not over HTTP")

    def describe(self):
        return {}


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return [PromptRequest(f"req-{i}", tuple(int(t) for t in rng.integers(1, 1000, n)))
            for i, n in enumerate(LENGTHS)]


def shape(outputs, lengths, names=None):
    """(final chunk per request, split steps' boundary request, computed, is-final), with the
    request indices renamed by ``names`` (an in-process run's index -> the case's)."""
    names = names or list(range(len(lengths)))
    finals = {names[r]: n for r, n in final_chunk_tokens(outputs, lengths).items()}
    splits = [(None if s.boundary_request is None else names[s.boundary_request],
               s.boundary_computed, s.boundary_is_final) for s in split_steps(outputs, lengths)]
    return finals, splits


def test_the_schedule_is_read_in_prompt_order_when_requests_arrive_reversed(
        tmp_path, monkeypatch, prompts):
    monkeypatch.setenv("AFD_EVIDENCE_DIR", str(tmp_path))
    backend = create_backend("cpu", topology=None, model_name=SMALL_MODEL, seed=0,
                             results_dir=str(tmp_path))
    arrival = [3, 1, 0, 2]
    lengths = [p.num_prompt_tokens for p in prompts]
    # What the server really scheduled: the same backend in-process, in arrival order.
    truth = backend.run([prompts[i] for i in arrival], SETTINGS)
    backend.reset_prefix_cache()
    served = WorkerEvidenceBackend(ArrivalOrderServer(backend, arrival), tmp_path,
                                   max_read_bytes=1 << 24).run(prompts, SETTINGS)
    assert served.steps, served.steps_absent_reason
    expected = shape(truth, [lengths[i] for i in arrival], names=arrival)
    assert expected[0] and any(step[0] is not None for step in expected[1])  # chunks and cuts
    assert shape(served, lengths) == expected
    # Read by the server's own numbering (the old positional join) they differ: the fault.
    positional = replace(served, steps=[{**step, "schedule": {
        **step["schedule"], "requests": step["schedule"]["server_requests"]}}
        for step in served.steps])
    try:
        misread = shape(positional, lengths)
    except AssertionError as error:  # the gate's own check: more tokens than the prompt has
        misread = str(error)
    assert misread != expected


def test_an_id_names_its_prompt_as_a_whole_token():
    ids = ["req-1", "req-10", "req-1-0"]
    patterns = [(i, client_id, id_pattern(client_id)) for i, client_id in enumerate(ids)]
    assert prompt_index("cmpl-req-10-0", patterns) == 1  # vLLM's decoration
    assert prompt_index("req-1#9f8e7d6c", patterns) == 0  # the harness server's
    assert prompt_index("cmpl-req-1-0-0", patterns) == 2  # the longest id that fits
    assert prompt_index("cmpl-req-2-0", patterns) is None


@pytest.mark.parametrize("ids, problem", [
    (None, "has no matching 'request_ids'"),
    (["req-0#a"], "has no matching 'request_ids'"),  # one id for two scheduled requests
    (["req-0#a", "other-7#b"], "name no single request of this case"),
])
def test_a_step_that_cannot_be_joined_is_a_problem_not_a_positional_guess(ids, problem):
    record = {"step": 4, "ranks": {"global_rank": 0},
              "schedule": {"requests": [1, 0], "num_scheduled_tokens": [5, 6]}}
    if ids is not None:
        record["request_ids"] = ids
    problems: list[str] = []
    join_requests([record], ["req-0", "req-1"], problems)
    assert len(problems) == 1 and problem in problems[0] and "step 4" in problems[0]
    assert record["schedule"]["requests"] == [1, 0]  # untouched


def test_a_joined_step_keeps_the_servers_numbering_beside_the_case_indices():
    record = {"step": 0, "ranks": {"global_rank": 0}, "request_ids": ["req-1#x", "req-0#y"],
              "schedule": {"requests": [0, 1], "num_scheduled_tokens": [5, 6]}}
    problems: list[str] = []
    join_requests([record], ["req-0", "req-1"], problems)
    assert not problems
    assert record["schedule"]["requests"] == [1, 0]
    assert record["schedule"]["server_requests"] == [0, 1]
