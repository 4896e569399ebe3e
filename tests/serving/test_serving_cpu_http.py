"""The streaming client and metrics reading against the real CPU backend served on loopback."""

import http.client
import json
import sys
from pathlib import Path

import pytest

import pytest_afd
from pytest_afd.backends import create_backend
from pytest_afd.core.backend import PromptRequest, RunSettings
from pytest_afd.serving.client import Arrival, CompletionsClient
from pytest_afd.serving.http_backend import cpu_server_spec
from pytest_afd.serving.lifecycle import ManagedServer
from pytest_afd.serving.prometheus import parse_prometheus, sum_metric
from pytest_afd.topology.spec import parse_topology
from pytest_afd.workloads import WorkloadSpec, build_workload

SERVER_TOPOLOGY = "dp3pcp8-ep8"
SERVER_MODEL = "reduced"
SERVER_SEED = 0
# Small pages so short test prompts produce whole-block prefix hits.
SERVER_SETTINGS = RunSettings(prefix_caching=True, block_size=16, return_logits=False)
PROMPT_LEN = 48


@pytest.fixture(scope="module")
def cpu_server(tmp_path_factory):
    """One server for the module: a child spends seconds importing torch."""
    log_dir = tmp_path_factory.mktemp("cpu-server")
    spec = cpu_server_spec(SERVER_SETTINGS, name="cpu-server", log_dir=log_dir,
                           topology=SERVER_TOPOLOGY, model_name=SERVER_MODEL, seed=SERVER_SEED)
    with ManagedServer(spec, log_dir).start() as server:
        yield server


def prompts(prefix, count, length=PROMPT_LEN, shared=()):
    """Distinct token ids per prefix and index, after an optional shared prefix."""
    salt = sum(map(ord, prefix)) * 31
    return [PromptRequest(f"{prefix}{i}", tuple(shared) + tuple((salt + 7 * i + j) % 1000 + 1
                                                                 for j in range(length)))
            for i in range(count)]


def post(server, path, body):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request("POST", path, body=body if isinstance(body, bytes) else json.dumps(body),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()


@pytest.fixture(scope="module")
def client(cpu_server):
    return CompletionsClient(cpu_server.base_url, SERVER_MODEL)


def batches_run(client):
    return sum_metric(parse_prometheus(client.get_text("/metrics")), ("afd:prefill_batches_total",))


def test_all_at_once_streams_every_request(client):
    batch = prompts("a", 4)
    batches_before = batches_run(client)
    run = client.run(batch, Arrival())
    # The engine batches a burst (batch window) instead of prefilling one request at a time.
    assert batches_run(client) - batches_before < len(batch)
    assert [r.request_id for r in run.results] == [p.request_id for p in batch]
    for result in run.results:
        assert result.success, result.error
        assert result.num_input_tokens == PROMPT_LEN and len(result.token_ids) == 1
        assert 0 < result.ttft_s <= result.latency_s
    summary = run.summary()
    assert summary["completed"] == 4 and summary["failed"] == 0
    assert summary["total_input_tokens"] == 4 * PROMPT_LEN
    assert summary["ttft_s"]["p50"] <= summary["ttft_s"]["p99"]


def test_served_tokens_match_the_in_process_cpu_backend(client):
    """The server is a transport: same next token as calling the backend directly."""
    batch = prompts("d", 2, shared=(999,) * 5)
    served = client.run(batch, Arrival(), read_metrics=False)
    backend = create_backend("cpu", topology=parse_topology(SERVER_TOPOLOGY),
                             model_name=SERVER_MODEL, seed=SERVER_SEED, results_dir=None)
    try:
        direct = backend.run(batch, SERVER_SETTINGS).by_id()
    finally:
        backend.close()
    for result in served.results:
        assert result.token_ids == (direct[result.request_id].next_token,)


def test_poisson_and_trace_arrivals_are_honoured(client):
    arrival = Arrival.poisson(rate=20.0, seed=3)
    offsets = arrival.schedule(4)
    assert offsets[0] == 0.0 and offsets == sorted(offsets) and offsets == arrival.schedule(4)
    run = client.run(prompts("p", 4), arrival, read_metrics=False)
    assert all(r.success for r in run.results)
    for result, offset in zip(run.results, offsets, strict=True):
        assert result.send_offset_s >= offset
    trace = client.run(prompts("t", 2), Arrival.trace([0.0, 0.3]), read_metrics=False)
    assert trace.results[1].send_offset_s >= 0.3 and all(r.success for r in trace.results)
    with pytest.raises(ValueError, match="2 offsets for 3 requests"):
        Arrival.trace([0.0, 0.1]).schedule(3)
    with pytest.raises(ValueError, match="finite rate > 0"):
        Arrival.poisson(rate=0.0)


def test_realized_prefix_hit_ratio_comes_from_server_metrics(client):
    client.reset_prefix_cache()
    shared = tuple(range(500, 532))  # two 16-token blocks
    seed_run = client.run(prompts("s", 1, shared=shared), Arrival())
    assert seed_run.prefix_cache.hit_tokens == 0
    warm = client.run(prompts("w", 3, shared=shared), Arrival())
    reported = sum(r.num_cached_tokens for r in warm.results)
    assert reported == 3 * len(shared)
    assert warm.prefix_cache.hit_tokens == reported
    assert warm.prefix_cache.queried_tokens == sum(r.num_input_tokens for r in warm.results)
    assert warm.summary()["prefix_cache"]["hit_ratio"] == pytest.approx(
        len(shared) / (len(shared) + PROMPT_LEN))
    client.reset_prefix_cache()
    cold = client.run(prompts("w", 1, shared=shared), Arrival())
    assert cold.prefix_cache.hit_ratio == 0.0


def test_health_models_and_describe(cpu_server, client):
    connection = http.client.HTTPConnection("127.0.0.1", cpu_server.port, timeout=10)
    connection.request("GET", "/health")
    assert connection.getresponse().status == 200
    connection.close()
    assert client.get_json("/v1/models")["data"][0]["id"] == SERVER_MODEL
    described = client.get_json("/afd/describe")
    assert described["backend"]["backend"] == "cpu"
    assert described["settings"]["prefix_caching"] is True
    # The code this server imported (an A/B of two checkouts records it per side).
    assert described["code"]["pytest_afd"] == str(Path(pytest_afd.__file__).resolve().parent)
    assert described["code"]["python"] == sys.executable


def test_non_streaming_completion_reports_usage(cpu_server):
    status, body = post(cpu_server, "/v1/completions",
                        {"model": SERVER_MODEL, "prompt": [1, 2, 3], "max_tokens": 1})
    assert status == 200
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 1
    assert len(body["choices"][0]["token_ids"]) == 1


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompt": "hello", "max_tokens": 1}, 400, "list of token ids"),
        ({"prompt": [1, -2], "max_tokens": 1}, 400, "list of token ids"),
        ({"prompt": [1, 2], "max_tokens": 16}, 400, "max_tokens=16"),
        ({"model": "other", "prompt": [1]}, 400, "model='other'"),
        (b"not json", 400, "Expecting value"),
        ({"prompt": [5000], "max_tokens": 1}, 400,
         "prompt[0]=5000: token id outside the vocabulary [0, 2048)"),
    ],
)
def test_bad_requests_get_clear_errors(cpu_server, client, body, status, message):
    got_status, got = post(cpu_server, "/v1/completions", body)
    assert got_status == status and message in got["error"]["message"]
    if body == {"prompt": [5000], "max_tokens": 1}:  # a refused request leaves the server serving
        single = client.complete(PromptRequest("after-error", (1, 2, 3)))
        assert single.success, single.error


def test_client_records_http_errors_per_request(client):
    bad = PromptRequest("oov", (5000,))
    result = client.complete(bad)
    assert not result.success and result.error.startswith("HTTP 400") and "vocabulary" in result.error


def test_workload_with_requested_hits_reports_realized_ratio(client):
    """A Stage-B-shaped run: warm the shared prefix, replay the workload's Poisson arrivals."""
    spec = WorkloadSpec(distribution="bimodal", num_requests=4, seed=5, scale=1 / 128,
                        vocab_size=1000, requested_hit_ratio=0.5, block_size=16,
                        arrival="poisson", arrival_rate=50.0)
    workload = build_workload(spec)
    arrival = Arrival.from_workload(workload)
    assert arrival.schedule(workload.num_requests) == list(workload.arrival_times_s)
    client.reset_prefix_cache()
    assert all(r.success for r in client.run(workload.prefix_warmup_prompts(), Arrival()).results)
    run = client.run(workload.prompts(), arrival)
    assert all(r.success for r in run.results)
    assert run.prefix_cache.hit_tokens == workload.designed_hit_tokens
    assert run.prefix_cache.hit_ratio == pytest.approx(workload.designed_hit_ratio)
    assert run.summary()["arrival"]["label"] == "workload " + workload.name + ": poisson"
