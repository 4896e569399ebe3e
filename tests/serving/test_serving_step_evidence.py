"""The CPU server as a stand-in deployment records step evidence for every policy alike.

A stage run against it (attach or launch, ``AFD_EVIDENCE_DIR`` shared by the server
and the harness) must measure ``none``, ``request_boundary`` and ``token_balanced``
with the same step lines: real/padded tokens per ubatch and per-layer expert load,
read back by the vllm-ascend backend's worker-evidence reader, never absent for the
controls only.
"""

from __future__ import annotations

import numpy as np

from afd_split.hook.planning.worker_evidence import EVIDENCE_DIR_ENV
from pytest_afd.backends.vllm_ascend.worker_evidence import WorkerEvidenceBackend
from pytest_afd.core.backend import PromptRequest, RunSettings
from pytest_afd.results import documents as results
from pytest_afd.serving.http_backend import (
    STEPS_NOT_OVER_HTTP,
    HttpBackend,
    cpu_server_launcher,
)

POLICIES = ("none", "request_boundary", "token_balanced")
PROMPT_LENGTHS = (150, 40, 22)


def test_every_policy_served_by_the_cpu_server_has_step_evidence(tmp_path, monkeypatch):
    monkeypatch.setenv(EVIDENCE_DIR_ENV, str(tmp_path / "evidence"))
    http = HttpBackend("vllm-ascend", frozenset(), cpu_server_launcher(
        log_dir=tmp_path / "servers", topology=None, model_name="reduced", seed=0))
    backend = WorkerEvidenceBackend.wrap_from_env(http, {EVIDENCE_DIR_ENV: str(tmp_path / "evidence")})
    rng = np.random.default_rng(0)
    prompts = [PromptRequest(f"r{i}", tuple(rng.integers(1, 2048, n).tolist()))
               for i, n in enumerate(PROMPT_LENGTHS)]
    steps, tokens = {}, {}
    try:
        for policy in POLICIES:
            outputs = backend.run(prompts, RunSettings(split_policy=policy, block_size=16))
            assert backend.last_problems == [], policy
            assert http.launches == POLICIES.index(policy) + 1  # one deployment per policy
            steps[policy] = outputs.steps
            evidence = results.evidence_from_outputs(outputs, routing="natural", num_ep_ranks=1)
            assert not results.is_absent(evidence["expert_load"]), policy
            tokens[policy] = evidence["tokens"]
        # Over HTTP alone (the same deployment, no worker lines read) the run says why it
        # has no steps: an absent record naming AFD_EVIDENCE_DIR, not zero tokens.
        bare = http.run(prompts, RunSettings(split_policy=POLICIES[-1], block_size=16))
        assert bare.steps == [] and bare.steps_absent_reason == STEPS_NOT_OVER_HTTP
        assert "AFD_EVIDENCE_DIR" in results.evidence_from_outputs(
            bare, routing="natural", num_ep_ranks=1)["tokens"]["absent_reason"]
    finally:
        http.close()
    for policy in POLICIES:
        assert steps[policy] and {s["policy"] for s in steps[policy]} == {policy}
        assert tokens[policy]["scheduled_real_tokens"] == sum(PROMPT_LENGTHS), policy
        assert all(isinstance(s["expert_load"], list) for s in steps[policy]), policy
    assert len(tokens["none"]["per_ubatch_real_tokens"]) == 1
    assert len(tokens["token_balanced"]["per_ubatch_real_tokens"]) == 2
    # The same record for every policy: the controls' lines carry every field the
    # candidate's do.
    keys = {policy: set().union(*(s.keys() for s in steps[policy])) for policy in POLICIES}
    assert keys["none"] == keys["request_boundary"] == keys["token_balanced"]
