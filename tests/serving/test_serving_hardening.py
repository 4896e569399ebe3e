"""The CPU HTTP server under bad requests, bursts and stalled clients (issue 15, "Serving").

The server runs in this process on loopback around the real CPU backend (the
reduced model), so the tests can count what each client got. Every wait is
bounded by a socket timeout; nothing depends on how fast the host is.
"""

from __future__ import annotations

import json

import pytest

from pytest_afd.core.backend import RunSettings
from pytest_afd.serving.requests import DEFAULT_REQUEST_QUEUE_SIZE, MAX_JSON_DEPTH, ServingLimits
from pytest_afd.serving.server import described_vocab_size
from tests.support.serving_test_helpers import (
    MODEL,
    VOCAB,
    RecordingBackend,
    burst,
    post,
    prompt,
    raw_exchange,
    request_bytes,
    serving,
)


def test_the_vocabulary_comes_from_the_backend_description(backend):
    assert described_vocab_size(backend.describe()) == VOCAB
    assert described_vocab_size({"backend": "other"}) is None


def test_one_out_of_vocabulary_token_fails_only_its_own_request(backend):
    bodies = [{"model": MODEL, "prompt": prompt(i)} for i in range(8)]
    bodies[3]["prompt"] = [1, 2, VOCAB]
    with serving(backend, ServingLimits(vocab_size=VOCAB)) as httpd:
        answers = burst(httpd.server_address[1], bodies)
    statuses = [status for status, _ in answers]
    assert statuses == [200, 200, 200, 400, 200, 200, 200, 200]
    message = answers[3][1]["error"]["message"]
    assert f"prompt[2]={VOCAB}: token id outside the vocabulary [0, {VOCAB})" in message
    assert [body["id"] for status, body in answers if status == 200] == [
        f"client-{i}" for i in range(8) if i != 3]


def test_a_batch_the_backend_fails_is_rerun_request_by_request(backend):
    """No parse-time vocabulary: the backend refuses the batch, and only the culprit fails."""
    recording = RecordingBackend(backend)
    bodies = [{"model": MODEL, "prompt": prompt(i)} for i in range(8)]
    bodies[5]["prompt"] = [1, VOCAB + 10]
    with serving(recording, ServingLimits(vocab_size=None)) as httpd:
        answers = burst(httpd.server_address[1], bodies)
    assert [status for status, _ in answers] == [200] * 5 + [500] + [200] * 2
    message = answers[5][1]["error"]["message"]
    assert "client-5" in message and "outside the vocabulary" in message
    # The failing batch held several clients; the rerun ran each one alone.
    assert any(len(batch) > 1 and "client-5" in batch for batch in recording.batches)
    assert ["client-5"] in recording.batches


def test_a_prompt_longer_than_the_server_admits_gets_400_for_itself_only(backend):
    bodies = [{"model": MODEL, "prompt": prompt(i)} for i in range(8)]
    bodies[0]["prompt"] = prompt(0, 65)
    with serving(backend, ServingLimits(vocab_size=VOCAB, max_prompt_tokens=64)) as httpd:
        answers = burst(httpd.server_address[1], bodies)
    assert [status for status, _ in answers] == [400] + [200] * 7
    assert "prompt has 65 tokens; this server admits at most 64 (--max-prompt-tokens 64)" in (
        answers[0][1]["error"]["message"])


def test_a_prompt_the_backend_cannot_schedule_unchunked_gets_400(backend):
    # The step budget (47) is charged in whole 16-token pages: two pages, 32 tokens.
    settings = RunSettings(return_logits=False, max_num_batched_tokens=47, block_size=16)
    with serving(backend, ServingLimits(vocab_size=VOCAB), settings=settings) as httpd:
        status, body = post(httpd.server_address[1], {"prompt": prompt(0, 33)})
        assert status == 400
        assert ("prompt has 33 tokens; this server admits at most 32 (the step budget "
                "max_num_batched_tokens in whole KV pages") in body["error"]["message"]
        assert post(httpd.server_address[1], {"prompt": prompt(0, 32)})[0] == 200


def test_a_long_prompt_is_admitted_into_a_batch_of_its_own(backend):
    """Token-budgeted admission: the prompts queued before a long one are not held back by it."""
    recording = RecordingBackend(backend)
    bodies = [{"model": MODEL, "prompt": prompt(i)} for i in range(6)]
    bodies[2]["prompt"] = prompt(2, 60)
    limits = ServingLimits(vocab_size=VOCAB, max_batch_tokens=32)
    with serving(recording, limits) as httpd:
        answers = burst(httpd.server_address[1], bodies)
    assert [status for status, _ in answers] == [200] * 6
    assert all(sum(60 if "client-2" == rid else 8 for rid in batch) <= 32 or batch == ["client-2"]
               for batch in recording.batches)
    assert ["client-2"] in recording.batches


def test_two_hundred_concurrent_clients_are_all_answered(backend):
    clients = 200
    assert ServingLimits().request_queue_size == DEFAULT_REQUEST_QUEUE_SIZE >= clients
    bodies = [{"model": MODEL, "prompt": prompt(i, 4)} for i in range(clients)]
    with serving(backend, ServingLimits(vocab_size=VOCAB), batch_window_s=0.02) as httpd:
        assert httpd.request_queue_size == DEFAULT_REQUEST_QUEUE_SIZE
        answers = burst(httpd.server_address[1], bodies)
    assert [status for status, _ in answers] == [200] * clients
    assert sorted(body["id"] for _, body in answers) == sorted(f"client-{i}" for i in range(clients))


def test_a_body_shorter_than_its_content_length_is_not_processed(backend):
    body = json.dumps({"prompt": [1, 2, 3]}).encode()
    with serving(backend, ServingLimits(vocab_size=VOCAB)) as httpd:
        answer = raw_exchange(httpd.server_address[1], request_bytes(body, len(body) + 40),
                              half_close=True)
    assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400")
    assert f"body has {len(body)} bytes, Content-Length says {len(body) + 40}".encode() in answer


def test_a_stalled_body_times_out_instead_of_hanging(backend):
    body = json.dumps({"prompt": [1, 2, 3]}).encode()
    with serving(backend, ServingLimits(vocab_size=VOCAB, read_timeout_s=1.0)) as httpd:
        # The connection stays open: only the server's read timeout ends the exchange.
        answer = raw_exchange(httpd.server_address[1], request_bytes(body, len(body) + 40),
                              half_close=False)
        assert b" 408 " in answer.split(b"\r\n")[0]
        assert b"body not received within 1.0 s" in answer
        assert post(httpd.server_address[1], {"prompt": [1, 2, 3]})[0] == 200  # still serving


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (json.dumps({"prompt": [1], "stream": True, "stream_options": "yes"}).encode(),
         "stream_options='yes'; expected a JSON object"),
        (json.dumps({"prompt": [1], "stream": True, "stream_options": [1]}).encode(),
         "stream_options='[1]'; expected a JSON object"),
        (json.dumps({"prompt": [1], "stream_options": {"include_usage": "no"}}).encode(),
         "stream_options.include_usage='no'; expected a boolean"),
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
         f"nested more than {MAX_JSON_DEPTH} levels deep"),
        (b'{"prompt": ' + b"[" * 20 + b"]" * 20 + b"}", f"nested more than {MAX_JSON_DEPTH} levels deep"),
        (json.dumps({"prompt": [1, "2"]}).encode(), "prompt[1]='2'"),
        (b"\xff\xfe", "body is not valid JSON"),
    ],
)
def test_malformed_bodies_get_an_answer_not_a_closed_connection(backend, payload, message):
    with serving(backend, ServingLimits(vocab_size=VOCAB)) as httpd:
        status, body = post(httpd.server_address[1], payload)
    assert status == 400 and message in body["error"]["message"]


@pytest.mark.parametrize(
    ("length", "status", "message"),
    [("abc", 400, "Content-Length 'abc' is not a byte count"),
     ("\u0663", 400, "is not a byte count"),
     (str(1 << 30), 413, "is more than 16777216 bytes")],
)
def test_bad_content_length_is_refused_by_name(backend, length, status, message):
    with serving(backend, ServingLimits(vocab_size=VOCAB)) as httpd:
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n")
        answer = raw_exchange(httpd.server_address[1], head.encode("utf-8"), half_close=True)
    assert f" {status} ".encode() in answer.split(b"\r\n")[0] and message.encode() in answer


def test_limits_refuse_nonsense():
    for field, value in (("max_prompt_tokens", 0), ("request_queue_size", -1), ("vocab_size", 0),
                         ("read_timeout_s", 0.0)):
        with pytest.raises(ValueError, match=f"{field}="):
            ServingLimits(**{field: value})


def test_an_8192_token_prompt_is_refused_by_the_default_cap_at_once(backend):
    """Without a cap one such prompt held every client for ~32 s on the CPU backend."""
    recording = RecordingBackend(backend)
    with serving(recording, ServingLimits(vocab_size=VOCAB)) as httpd:
        status, body = post(httpd.server_address[1], {"prompt": prompt(0, 8192)})
    assert status == 400
    assert "prompt has 8192 tokens; this server admits at most 4096 (--max-prompt-tokens 4096)" in (
        body["error"]["message"])
    assert recording.batches == []  # refused while parsing: the engine never saw it
