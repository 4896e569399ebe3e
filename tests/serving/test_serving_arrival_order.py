"""A burst runs in the order its client sent it, not the order handler threads submitted it.

Stage C's "fixed" order (long requests clustered on one side) only means something
if the server's batch keeps it: the client connects and sends in prompt order from
one thread, the server numbers connections as it accepts them, and a batch runs in
accept order (a FCFS scheduler's view of arrival).
"""

from __future__ import annotations

import numpy as np

from pytest_afd.core.backend import PromptRequest, RunSettings
from pytest_afd.serving.client import CompletionsClient
from pytest_afd.serving.engine import PrefillEngine
from pytest_afd.serving.requests import ServingLimits
from tests.support.serving_test_helpers import MODEL, VOCAB, RecordingBackend, serving

BURST = 8


def prompts(count: int = BURST) -> list[PromptRequest]:
    rng = np.random.default_rng(0)
    return [PromptRequest(f"req-{index}", tuple(int(t) for t in rng.integers(1, VOCAB, 8 + index)))
            for index in range(count)]


def test_a_batch_runs_in_accept_order_whatever_the_submission_order(backend):
    recording = RecordingBackend(backend)
    engine = PrefillEngine(recording, RunSettings(return_logits=False, max_num_seqs=8),
                           batch_window_s=1.0)
    futures = [engine.submit(prompt, accepted=accepted)  # handler threads raced: 3, 1, 2
               for prompt, accepted in zip(prompts(3), (3, 1, 2), strict=True)]
    engine.start()  # all three are queued: one batch
    try:
        for future in futures:
            assert future.result(timeout=300).error is None
    finally:
        engine.stop()
    assert recording.batches == [["req-1", "req-2", "req-0"]]


def test_a_clients_burst_reaches_the_backend_in_prompt_order(backend):
    recording = RecordingBackend(backend)
    sent = prompts()
    with serving(recording, ServingLimits(vocab_size=VOCAB), batch_window_s=2.0) as httpd:
        client = CompletionsClient(f"http://127.0.0.1:{httpd.server_address[1]}", MODEL)
        run = client.run(sent, read_metrics=False)
    assert all(result.error is None for result in run.results), [r.error for r in run.results]
    served = [request_id for batch in recording.batches for request_id in batch]
    assert served == [prompt.request_id for prompt in sent], recording.batches
