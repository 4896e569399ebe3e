"""Launch mode end to end on loopback: plan -> processes -> /health -> client -> stop.

vLLM cannot be installed here, so the plan's executable is a small stand-in
CLI: for ``serve`` with role attention it execs the real CPU-backend HTTP server
(honouring ``--port``, ``--block-size`` and ``--enable-prefix-caching``), for
the FFN role it serves ``/health`` only, and it logs the environment it got.
Everything else (plan, env, devices, process group, health wait, logs, client,
shutdown) is the production path.
"""

import json
import socket
import sys
import textwrap
from pathlib import Path

from pytest_afd.backends.base import PromptRequest, RunSettings
from pytest_afd.backends.vllm_ascend.backend import LAUNCH_FIELDS, capabilities_for, local_launcher
from pytest_afd.serving.http_backend import HttpBackend
from pytest_afd.topology import parse_topology

TOPOLOGY = parse_topology("dp1pcp8-ep8")

STAND_IN_VLLM = textwrap.dedent(f"""\
    #!{sys.executable}
    import http.server, json, os, sys
    args = sys.argv[1:]
    assert args[0] == "serve", args
    flag = lambda name: args[args.index(name) + 1]
    role = json.loads(flag("--additional-config"))["afd"]["role"]
    print("ASCEND_RT_VISIBLE_DEVICES=" + os.environ["ASCEND_RT_VISIBLE_DEVICES"], flush=True)
    if role == "ffn":
        class Health(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200 if self.path == "/health" else 404)
                self.end_headers()
        http.server.HTTPServer(("127.0.0.1", int(flag("--port"))), Health).serve_forever()
    settings = {{"block_size": int(flag("--block-size")), "return_logits": False,
                "prefix_caching": "--enable-prefix-caching" in args}}
    os.execv(sys.executable, [sys.executable, "-m", "pytest_afd.cli", "serve", "--backend", "cpu",
             "--model-name", "reduced", "--served-model-name", flag("--served-model-name"),
             "--port", flag("--port"), "--settings-json", json.dumps(settings)])
""")


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_local_launch_serves_stops_and_logs(tmp_path):
    stand_in = tmp_path / "vllm"
    stand_in.write_text(STAND_IN_VLLM)
    stand_in.chmod(0o755)
    log_dir = tmp_path / "servers"
    launcher = local_launcher(TOPOLOGY, model="/models/DeepSeek-V3.2-W8A8", devices=16,
                              log_dir=log_dir, startup_timeout_s=120.0, overrides={
                                  "vllm_executable": str(stand_in), "api_port": free_port(),
                                  "ffn_api_port": free_port()})
    backend = HttpBackend("vllm-ascend", capabilities_for(TOPOLOGY), launcher,
                          server_fields=LAUNCH_FIELDS)
    prompts = [PromptRequest("a", tuple(range(1, 40))), PromptRequest("b", tuple(range(1, 25)))]
    settings = RunSettings(block_size=16, prefix_caching=True, split_align=8, pcp_size=8,
                           split_policy="request_boundary")
    pids = []
    try:
        first = backend.run(prompts, settings)
        assert [r.error for r in first.requests] == [None, None]
        again = backend.run(prompts, settings)
        assert [r.num_cached_tokens for r in again.requests] == [32, 16]  # the flag reached the server
        assert backend.launches == 1
        group = backend._session.server
        pids = [server.pid for server in group.servers]
        plan = json.loads((log_dir / "launch-plan.json").read_text())
        assert [p["role"] for p in plan["processes"]] == ["attention", "ffn"]
        assert plan["run_settings"]["prefix_caching"] is True
        ffn_log = (log_dir / "1-ffn-node0.log").read_text()
        assert "ASCEND_RT_VISIBLE_DEVICES=8,9,10,11,12,13,14,15" in ffn_log
        attention_log = (log_dir / "0-attention-node0.log").read_text()
        assert "ASCEND_RT_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in attention_log
    finally:
        backend.close()
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
