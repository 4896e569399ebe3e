"""Top-k logprobs over HTTP: vLLM's request/response fields, served by the real CPU backend."""

import numpy as np
import pytest

from pytest_afd.backends import create_backend
from pytest_afd.core.backend import CAP_TOPK_LOGPROBS, PromptRequest, RunSettings
from pytest_afd.serving import logprobs as lp
from pytest_afd.serving.client import CompletionsClient
from pytest_afd.serving.handler import parse_logprobs_request
from pytest_afd.serving.http_backend import HttpBackend, cpu_server_spec
from pytest_afd.serving.lifecycle import ManagedServer
from pytest_afd.serving.requests import BadRequest
from pytest_afd.topology.spec import parse_topology

TOPOLOGY = "dp3pcp8-ep8"
SETTINGS = RunSettings(block_size=16, return_logits=False)
PROMPTS = [PromptRequest("a", tuple(range(5, 61))), PromptRequest("b", tuple(range(100, 133)))]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logprob-server")
    spec = cpu_server_spec(SETTINGS, name="cpu-server", log_dir=log_dir, topology=TOPOLOGY,
                           model_name="reduced", seed=0)
    with ManagedServer(spec, log_dir).start() as managed:
        yield managed


def test_top_logprobs_round_trip_through_the_wire_format():
    logits = np.array([0.5, 3.0, -1.0, 3.0, 2.0])
    body = lp.completion_logprobs(logits, sampled=1, k=3)
    assert body["tokens"] == ["token_id:1"]
    assert list(body["top_logprobs"][0]) == ["token_id:1", "token_id:3", "token_id:4"]
    parsed = lp.parse_first_top_logprobs(body)
    expected = logits - np.log(np.exp(logits).sum())
    assert parsed == pytest.approx({1: expected[1], 3: expected[3], 4: expected[4]})
    with pytest.raises(lp.LogprobsFormatError, match="return_tokens_as_token_ids"):
        lp.parse_first_top_logprobs({"top_logprobs": [{"hello": -0.1}]})


def test_dense_rows_keep_each_sides_top_k():
    actual, expected, vocab = lp.dense_rows([{7: -0.1, 3: -2.0}], [{7: -0.2, 9: -1.0}])
    assert vocab == [3, 7, 9]
    assert actual.tolist() == [[-2.0, -0.1, -np.inf]]
    assert expected.tolist() == [[-np.inf, -0.2, -1.0]]
    assert lp.shared_logprob_error([{7: -0.1}], [{7: -0.25}]) == pytest.approx(0.15)


@pytest.mark.parametrize("body, message", [
    ({"logprobs": 5}, "return_tokens_as_token_ids"),
    ({"logprobs": -1, "return_tokens_as_token_ids": True}, "logprobs=-1"),
    ({"logprobs": 21, "return_tokens_as_token_ids": True}, "0..20"),
    ({"logprobs": True, "return_tokens_as_token_ids": True}, "logprobs=True"),
    ({"prompt_logprobs": 5}, "prompt_logprobs=5"),
])
def test_bad_logprob_requests_are_refused_by_name(body, message):
    with pytest.raises(BadRequest, match=message):
        parse_logprobs_request(body)


def test_served_logprobs_are_the_backends_own_log_softmax(server, tmp_path):
    client = CompletionsClient(server.base_url, "reduced")
    result = client.complete(PROMPTS[0], logprobs=lp.DEFAULT_NUM_LOGPROBS)
    assert result.error is None and result.success
    assert len(result.top_logprobs) == lp.DEFAULT_NUM_LOGPROBS
    assert max(result.top_logprobs, key=result.top_logprobs.get) == result.token_ids[0]
    backend = create_backend("cpu", topology=parse_topology(TOPOLOGY), model_name="reduced",
                             seed=0, results_dir=tmp_path)
    try:
        direct = backend.run(PROMPTS[:1], RunSettings(block_size=16))
    finally:
        backend.close()
    expected = lp.top_logprobs_from_logits(direct.requests[0].logits, lp.DEFAULT_NUM_LOGPROBS)
    assert result.top_logprobs.keys() == expected.keys()
    assert [result.top_logprobs[t] for t in expected] == pytest.approx(list(expected.values()),
                                                                       abs=1e-5)
    # Without the field, no logprobs travel.
    assert client.complete(PROMPTS[0]).top_logprobs is None


def test_http_backend_asks_for_logprobs_only_when_declared(server):
    def attach(settings):
        from pytest_afd.serving.http_backend import AttachedServer

        return AttachedServer(server.base_url, "reduced")

    declared = HttpBackend("x", frozenset({CAP_TOPK_LOGPROBS}), attach)
    outputs = declared.run(PROMPTS, RunSettings(block_size=16))
    assert all(len(r.top_logprobs) == lp.DEFAULT_NUM_LOGPROBS for r in outputs.requests)
    assert declared.completed_runs == 1
    quiet = HttpBackend("y", frozenset(), attach).run(PROMPTS, RunSettings(block_size=16))
    assert all(r.top_logprobs is None for r in quiet.requests)
    no_outputs = declared.run(PROMPTS, RunSettings(block_size=16, return_logits=False))
    assert all(r.top_logprobs is None for r in no_outputs.requests)
