"""--afd-ab-url against two live CPU servers: each side attached to its own URL, a stand-in on both.

Two harness CPU servers (a few seconds each) stand in for two deployments; the
session-level flag checks are test_ab_sides.py.
"""

from __future__ import annotations

import json
import os

from pytest_afd.core.backend import PromptRequest, RunSettings
from pytest_afd.run import ab_sides
from pytest_afd.serving.http_backend import cpu_server_spec
from pytest_afd.serving.lifecycle import ManagedServer
from pytest_afd.topology.spec import parse_topology


def test_two_deployment_urls_each_side_attached_to_its_own_and_labelled_a_stand_in(tmp_path):
    """``--afd-ab-url``: each side's backend attaches to its URL (the AFD_ASCEND_SERVER_URL
    path), its runs go there, and the harness's server is a stand-in on both sides."""
    settings = RunSettings(split_policy="token_balanced", max_num_batched_tokens=256,
                           max_num_seqs=4, block_size=16)
    topology = parse_topology("dp2-ep2")
    servers = [ManagedServer(cpu_server_spec(settings, name=f"s{i}", log_dir=tmp_path,
                                             topology=topology.canonical, model_name="reduced",
                                             seed=0), tmp_path).start() for i in range(2)]
    backends = []
    deployment = ("AFD_ASCEND_SERVER_URL", "AFD_ASCEND_DEPLOYMENTS", "AFD_ASCEND_DEPLOY_COMMAND",
                  "AFD_EVIDENCE_DIR")
    try:
        environ = {**{k: v for k, v in os.environ.items() if k not in deployment},
                   "AFD_ASCEND_SERVER_SETTINGS": json.dumps({"split_policy": "token_balanced",
                                                              "max_num_batched_tokens": 256,
                                                              "max_num_seqs": 4,
                                                              "block_size": 16})}
        sides = ab_sides.parse_sides([s.base_url for s in servers], None, None, settings_ab=None,
                                     backend="vllm-ascend", environ=environ)
        prompts = [PromptRequest("r0", tuple(range(1, 40))), PromptRequest("r1", (5,) * 30)]
        for side, server in zip(sides.sides, servers, strict=True):
            backend = ab_sides.create_side_backend(side, topology=topology, model_name="reduced",
                                                   seed=0, results_dir=tmp_path / "r",
                                                   environ=environ)
            backends.append(backend)
            outputs = backend.run(prompts, settings)
            assert len(outputs.requests) == 2
            record = ab_sides.side_evidence(side, backend)
            assert record["url"] == record["served"]["url"] == server.base_url
            assert record["served"]["stand_in_device"] == "cpu"
            assert record["served"]["settings"]["split_policy"] == "token_balanced"
            assert record["served"]["models"][0]["id"]  # its /v1/models listing
            assert backend.stand_in_device() == "cpu"  # the ledger's question: never hardware
    finally:
        for backend in backends:
            backend.close()
        for server in servers:
            server.stop()
