"""The harness's instrumented run reaches the harness's own server: requests the client
marks (``X-AFD-Instrument``) run in an instrumented batch, unmarked ones never do."""

from __future__ import annotations

from pytest_afd.core.backend import PromptRequest
from pytest_afd.serving.client import CompletionsClient
from pytest_afd.serving.requests import ServingLimits
from tests.support.serving_test_helpers import MODEL, VOCAB, RecordingBackend, prompt, serving


class SettingsRecordingBackend(RecordingBackend):
    def __init__(self, inner):
        super().__init__(inner)
        self.instrumented: list[bool] = []

    def run(self, prompts, settings):
        self.instrumented.append(settings.instrument)
        return super().run(prompts, settings)


def test_marked_requests_run_instrumented_batches_only(backend):
    recording = SettingsRecordingBackend(backend)
    prompts = [PromptRequest(f"r{i}", tuple(prompt(i))) for i in range(2)]
    with serving(recording, ServingLimits(vocab_size=VOCAB)) as httpd:
        client = CompletionsClient(f"http://127.0.0.1:{httpd.server_address[1]}", MODEL)
        plain = client.run(prompts, read_metrics=False)
        assert all(r.success for r in plain.results) and not any(recording.instrumented)
        seen = len(recording.instrumented)
        marked = client.run(prompts, read_metrics=False, instrument=True)
        assert all(r.success for r in marked.results)
        assert recording.instrumented[seen:] and all(recording.instrumented[seen:])
