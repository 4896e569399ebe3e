"""Gate references in the golden store: round trip, and refusal when recorded for other inputs."""


import numpy as np
import pytest

from pytest_afd.core.backend import PromptRequest, RequestOutput, RunOutputs, RunSettings
from pytest_afd.golden.store import (
    GoldenCorruptError,
    GoldenMismatchError,
    GoldenStore,
    check_metadata,
)
from suites.gates.gate_reference import (
    KIND_LOGITS,
    KIND_TOPK,
    GateReferences,
    comparable_outputs,
    from_array,
    to_array,
)

PROMPTS = [PromptRequest("r0", (1, 2, 3)), PromptRequest("r1", (4, 5))]
SETTINGS = RunSettings(split_policy="token_balanced", prefix_caching=True, chunk_size=256)


def topk_outputs(rows):
    return RunOutputs(requests=[
        RequestOutput(p.request_id, p.num_prompt_tokens, 0, max(row, key=row.get), top_logprobs=row)
        for p, row in zip(PROMPTS, rows, strict=True)])


class FakeDeployment:
    """Records the settings it was asked to run; answers with fixed top-k logprobs."""

    name = "fake"
    capabilities = frozenset()

    def __init__(self, rows):
        self.rows, self.settings = rows, []

    def reset_prefix_cache(self):
        pass

    def run(self, prompts, settings):
        self.settings.append(settings)
        return topk_outputs(self.rows)


def test_topk_reference_round_trips_through_the_golden_store(tmp_path):
    rows = [{7: -0.1, 3: -2.5, 9: -3.0}, {2: -0.5, 8: -1.0, 1: -4.0}]
    references = GateReferences("record", GoldenStore(tmp_path), "reduced", "vllm-ascend")
    deployment = FakeDeployment(rows)
    references.record("reference/gate1/x/dp3pcp8-ep8-none", deployment, PROMPTS, SETTINGS)
    # The reference ran unsplit, uncached and unchunked, whatever the case's settings.
    ran = deployment.settings[0]
    assert (ran.split_policy, ran.prefix_caching, ran.chunk_size) == ("none", False, None)
    checking = GateReferences("check", GoldenStore(tmp_path), "reduced", "vllm-ascend")
    loaded = checking.load("reference/gate1/x/dp3pcp8-ep8-none", PROMPTS, SETTINGS)
    assert [r.top_logprobs for r in loaded.requests] == rows
    assert [r.next_token for r in loaded.requests] == [7, 2]
    same = comparable_outputs(topk_outputs(rows), loaded, "float32")
    assert same.profile == "topk_logprob" and same.shared_logprob_error == 0.0


def test_a_reference_recorded_for_other_prompts_is_refused_by_field(tmp_path):
    references = GateReferences("record", GoldenStore(tmp_path), "reduced", "vllm-ascend")
    references.record("reference/g", FakeDeployment([{1: -0.1}, {2: -0.1}]), PROMPTS, SETTINGS)
    checking = GateReferences("check", GoldenStore(tmp_path), "full", "vllm-ascend")
    other = [PROMPTS[0], PromptRequest("r1", (4, 6))]
    with pytest.raises(GoldenMismatchError, match=r"'prompts_sha256'.*'model': \('reduced', 'full'\)"):
        checking.load("reference/g", other, SETTINGS)
    store = GoldenStore(tmp_path)
    store.save("plain", np.zeros(3))
    with pytest.raises(GoldenCorruptError, match="not recorded as a gate reference"):
        check_metadata("plain", store.load("plain")[1], {"model": "reduced"})


def test_logits_references_keep_logits_and_mixed_sides_compare_on_topk():
    logits = np.array([[0.0, 3.0, 1.0], [2.0, 0.0, -1.0]], dtype=np.float32)
    outputs = RunOutputs(requests=[
        RequestOutput(p.request_id, p.num_prompt_tokens, 0, int(np.argmax(row)), logits=row)
        for p, row in zip(PROMPTS, logits, strict=True)])
    kind, array = to_array(outputs)
    assert kind == KIND_LOGITS and array.shape == (2, 3)
    rebuilt = from_array(kind, array, PROMPTS)
    assert comparable_outputs(outputs, rebuilt, "float32").kind == KIND_LOGITS
    mixed = comparable_outputs(outputs, topk_outputs([{1: -0.2, 2: -2.2}, {0: -0.1, 1: -2.1}]),
                               "float32")
    assert mixed.kind == KIND_TOPK


def test_a_backend_with_neither_logits_nor_logprobs_fails_the_gate():
    bare = RunOutputs(requests=[RequestOutput("r0", 3, 0, 1)])
    with pytest.raises(AssertionError, match="neither logits nor top-k logprobs"):
        comparable_outputs(bare, bare, "float32")
