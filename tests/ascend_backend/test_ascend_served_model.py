"""Attach mode finds the model the deployment serves (``/v1/models``) instead of assuming the recipe's.

A CPU server started with ``--model-name reduced`` once answered every request
of the documented record command with ``HTTP 400: model='deepseek_v3_2'``.
Over loopback: the real CPU server's handler (its ``/v1/models``), a stand-in
listing two models, and nothing listening.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pytest_afd.backends.vllm_ascend.backend import (
    ENV_SERVED_MODEL_NAME,
    ENV_SERVER_SETTINGS,
    ENV_SERVER_URL,
    LAUNCH_FIELDS,
    create_backend,
    served_model_name,
)
from pytest_afd.core.backend import BackendUnavailable, PromptRequest, RunSettings
from pytest_afd.serving.client import CompletionsClient
from pytest_afd.serving.http_backend import cpu_server_spec
from pytest_afd.serving.lifecycle import LOOPBACK_HOST, ManagedServer
from pytest_afd.serving.requests import STAND_IN_FIELD
from pytest_afd.serving.server import AfdHTTPServer
from pytest_afd.topology.spec import parse_topology

TOPOLOGY = "dp3pcp8-ep8"


@contextmanager
def serving(httpd: ThreadingHTTPServer) -> Iterator[str]:
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{LOOPBACK_HOST}:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


class TwoModels(BaseHTTPRequestHandler):
    """A deployment serving two models (vLLM with LoRA adapters lists each)."""

    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": "deepseek_v3_2"},
                                                       {"id": "reduced"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        """Quiet."""


def test_the_one_served_model_is_discovered_from_the_real_handler():
    # /v1/models needs no engine: the CPU server's own handler answers it.
    with serving(AfdHTTPServer((LOOPBACK_HOST, 0), None, "reduced")) as url:
        assert served_model_name(url, {}) == "reduced"
        assert served_model_name(url, {ENV_SERVED_MODEL_NAME: "given"}) == "given"
        # The harness's server labels itself a stand-in, engine or not (issue 40).
        [entry] = CompletionsClient(url, model="").get_json("/v1/models")["data"]
        assert entry[STAND_IN_FIELD]["device"]


def test_several_models_name_the_variable_to_set():
    with serving(ThreadingHTTPServer((LOOPBACK_HOST, 0), TwoModels)) as url:
        with pytest.raises(BackendUnavailable) as caught:
            served_model_name(url, {})
    message = str(caught.value)
    assert "lists 2 models ['deepseek_v3_2', 'reduced']" in message
    assert f"set {ENV_SERVED_MODEL_NAME}" in message


def test_an_unreachable_deployment_names_the_variable_to_set():
    with serving(ThreadingHTTPServer((LOOPBACK_HOST, 0), TwoModels)) as url:
        pass  # closed: nothing listens on that port any more
    with pytest.raises(BackendUnavailable, match=f"cannot read the served model name .*set "
                                                 f"{ENV_SERVED_MODEL_NAME}"):
        served_model_name(url, {})


def test_attach_mode_runs_against_a_server_with_another_model_name(tmp_path):
    """The documented record command's backend, no AFD_ASCEND_SERVED_MODEL_NAME: requests succeed."""
    emulation = parse_topology(TOPOLOGY).cpu_emulation()
    settings = RunSettings(block_size=128, split_align=emulation.split_align,
                           pcp_size=emulation.pcp_size, return_logits=False)
    spec = cpu_server_spec(settings, name="deployment", log_dir=tmp_path, topology=TOPOLOGY,
                           model_name="reduced", seed=0, startup_timeout_s=300)
    declared = {name: dataclasses.asdict(settings)[name] for name in LAUNCH_FIELDS}
    with ManagedServer(spec, tmp_path).start() as server:
        environ = {ENV_SERVER_URL: server.base_url, ENV_SERVER_SETTINGS: json.dumps(declared)}
        backend = create_backend(topology=parse_topology(TOPOLOGY), model_name="reduced", seed=0,
                                 results_dir=tmp_path, environ=environ)
        try:
            outputs = backend.run([PromptRequest("a", tuple(range(1, 40)))], settings)
        finally:
            backend.close()
    assert [request.error for request in outputs.requests] == [None]
