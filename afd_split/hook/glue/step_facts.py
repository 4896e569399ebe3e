"""The per-request facts every hook step line carries: the engine's request ids and schedule.

The harness joins a worker's step lines to a case's prompts by request id
(``pytest_afd.backends.vllm_ascend.request_join``) and the gates read each step's
per-request schedule (``requests``, ``num_scheduled_tokens``, ``num_computed_tokens``),
as the CPU backend writes them, so one join and one set of gate checks serve both.

Upstream facts (read at vLLM 0.19.1 ``v1/worker/gpu_input_batch.py`` /
``gpu_model_runner.py``, and afd-plugin main 2e4378f and release/v0.19.1rc1 2f4f462
``afd_plugin/v1/worker/npu/attention_model_runner.py``): the runner's persistent
input batch exposes ``req_ids`` (a ``list[str]`` property over ``_req_ids``) in
batch-index order; the runner builds ``num_scheduled_tokens_np`` as
``scheduler_output.num_scheduled_tokens[i] for i in input_batch.req_ids`` and the
plugin's attention runner indexes requests by ``input_batch.req_id_to_index`` in
that order. So ``req_ids[:num_reqs]`` name the host counts the hook plans on,
position by position. A runner without the field gets a line saying the ids are
absent and why; they are never invented.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from afd_split.hook.planning.engine_step import REQUEST_IDS_FIELD

SCHEDULE_FIELD = "schedule"
REQUEST_IDS_ABSENT_FIELD = "request_ids_absent_reason"
SCHEDULE_ABSENT_FIELD = "schedule_absent_reason"


def step_schedule(num_scheduled_tokens, num_computed_tokens) -> dict[str, Any]:
    """The step's per-request schedule in batch order (the CPU backend's keys; ``requests``
    are the server batch's positions, which the harness join maps to the case's prompts)."""
    scheduled = [int(n) for n in np.asarray(num_scheduled_tokens).reshape(-1)]
    computed = [int(n) for n in np.asarray(num_computed_tokens).reshape(-1)[:len(scheduled)]]
    if len(computed) != len(scheduled):
        raise ValueError(f"{len(scheduled)} scheduled requests but {len(computed)} computed counts")
    return {"requests": list(range(len(scheduled))), "num_scheduled_tokens": scheduled,
            "num_computed_tokens": computed, "num_tokens": sum(scheduled)}


def batch_request_ids(input_batch, num_reqs: int) -> dict[str, Any]:
    """``{request_ids: [...]}`` from ``input_batch.req_ids[:num_reqs]``, or the absent form."""
    try:
        req_ids = input_batch.req_ids
    except AttributeError:
        return {REQUEST_IDS_ABSENT_FIELD: f"the runner's input batch ({type(input_batch).__name__}) "
                                          "has no req_ids"}
    ids = list(req_ids[:num_reqs])
    if len(ids) != num_reqs or any(request_id is None for request_id in ids):
        return {REQUEST_IDS_ABSENT_FIELD: f"input_batch.req_ids holds {ids!r} for {num_reqs} "
                                          "scheduled requests"}
    return {REQUEST_IDS_FIELD: [str(request_id) for request_id in ids]}


def runner_step_facts(runner, num_scheduled_tokens, num_computed_tokens=None) -> dict[str, Any]:
    """The step line's ``request_ids`` and ``schedule`` from the runner's input batch
    (``num_computed_tokens``: the host counts already read, or None to read them here)."""
    num_reqs = len(num_scheduled_tokens)
    try:
        input_batch = runner.input_batch
    except AttributeError:
        reason = f"the runner ({type(runner).__name__}) has no input_batch"
        return {REQUEST_IDS_ABSENT_FIELD: reason, SCHEDULE_ABSENT_FIELD: reason}
    if num_computed_tokens is None:
        num_computed_tokens = input_batch.num_computed_tokens_cpu_tensor[:num_reqs].numpy()
    return {**batch_request_ids(input_batch, num_reqs),
            SCHEDULE_FIELD: step_schedule(num_scheduled_tokens, num_computed_tokens)}
