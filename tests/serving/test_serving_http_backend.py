"""HttpBackend: the Backend protocol over HTTP, restarting servers when server-side settings change."""

import pytest

from pytest_afd.core.backend import Backend, PromptRequest, RunSettings
from pytest_afd.serving.http_backend import (
    AttachedServer,
    HttpBackend,
    cpu_server_launcher,
    server_side_settings,
)

PROMPTS = [PromptRequest("a", tuple(range(1, 40))), PromptRequest("b", tuple(range(3, 20)))]


def test_runs_reuse_the_server_and_restart_it_for_new_settings(tmp_path):
    launcher = cpu_server_launcher(log_dir=tmp_path, topology="dp3pcp8-ep8", model_name="reduced",
                                   seed=0)
    backend = HttpBackend("cpu-http", frozenset({"prefix_cache"}), launcher)
    assert isinstance(backend, Backend)
    try:
        first = backend.run(PROMPTS, RunSettings(block_size=16))
        assert [r.error for r in first.requests] == [None, None]
        assert [r.num_prompt_tokens for r in first.requests] == [39, 17]
        assert all(r.logits is None and r.next_token >= 0 for r in first.requests)
        first_server = backend._session.server
        # Client-side fields (logits, instrumentation) do not need a new server.
        backend.run(PROMPTS, RunSettings(block_size=16, return_logits=False, instrument=True))
        assert backend.launches == 1
        assert backend.describe()["server"]["settings"]["prefix_caching"] is False
        cached = RunSettings(block_size=16, prefix_caching=True)
        backend.run(PROMPTS, cached)
        again = backend.run(PROMPTS, cached)
        assert backend.launches == 2 and first_server.poll() is not None
        assert [r.num_cached_tokens for r in again.requests] == [32, 16]
        backend.reset_prefix_cache()
        assert [r.num_cached_tokens for r in backend.run(PROMPTS, cached).requests] == [0, 0]
        # Same tokens whatever the server-side settings (prefix hits change no output).
        assert [r.next_token for r in again.requests] == [r.next_token for r in first.requests]
    finally:
        backend.close()
    assert backend._session is None


def test_attached_server_is_never_restarted_or_stopped():
    attached = AttachedServer("http://127.0.0.1:9", "m")
    assert attached.exit_reason() is None
    attached.close()  # nothing to stop
    with pytest.raises(ValueError, match="expected http://HOST:PORT"):
        HttpBackend("x", frozenset(), lambda settings: AttachedServer("localhost", "m")).run(
            PROMPTS, RunSettings())


def test_server_side_settings_drop_client_fields():
    assert server_side_settings(RunSettings(instrument=True)) == RunSettings(return_logits=False)
    chosen = server_side_settings(RunSettings(split_align=4, chunk_size=256), ("chunk_size",))
    assert chosen == RunSettings(chunk_size=256, return_logits=False)
