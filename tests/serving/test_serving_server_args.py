"""The CPU server's command-line contract: loopback only, RunSettings JSON validated."""

import dataclasses
import json
import subprocess
import sys

import pytest

from pytest_afd.backends.base import RunSettings
from pytest_afd.serving.http_backend import cpu_server_spec
from pytest_afd.serving.requests import BadRequest, parse_completion_request
from pytest_afd.serving.server import (
    PEER_TIMEOUT_ENV,
    check_loopback,
    peer_timeout_from,
    settings_from_json,
)


def test_settings_round_trip_and_bad_values():
    settings = RunSettings(split_policy="request_boundary", chunk_size=256, block_size=16)
    assert settings_from_json(json.dumps(dataclasses.asdict(settings))) == settings
    with pytest.raises(ValueError, match=r"unknown RunSettings fields \['chunk'\]"):
        settings_from_json('{"chunk": 8}')
    with pytest.raises(ValueError, match="split_policy='diagonal'"):
        settings_from_json('{"split_policy": "diagonal"}')
    with pytest.raises(ValueError, match="must be a JSON object"):
        settings_from_json("[1]")


def test_only_loopback_hosts_are_served():
    assert check_loopback("127.0.0.1") == "127.0.0.1"
    with pytest.raises(ValueError, match=r"host='0\.0\.0\.0'; this unauthenticated server binds loopback only"):
        check_loopback("0.0.0.0")


def test_completion_request_contract():
    assert parse_completion_request({"prompt": [1, 2], "stream": True,
                                     "stream_options": {"include_usage": True}}, "m") == ((1, 2), True, True)
    with pytest.raises(BadRequest, match="stream='yes'"):
        parse_completion_request({"prompt": [1], "stream": "yes"}, "m")
    with pytest.raises(BadRequest, match="list of token ids"):
        parse_completion_request({"prompt": [True]}, "m")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--host", "0.0.0.0"], "binds loopback only"),
        (["--settings-json", '{"routing": "skewed"}'], "routing='skewed'"),
        (["--max-prompt-tokens", "0"], "'0': expected a positive integer"),
        (["--request-queue-size", "\u0663"], "expected a positive integer"),
        (["--read-timeout-s", "inf"], "'inf': expected seconds > 0"),
        (["--afd-peer-timeout-s", "0"], "'0': expected seconds in (0, 86400]"),
        (["--afd-peer-timeout-s", "soon"], "'soon': expected a number of seconds"),
        (["--max-connections", "0"], "'0': expected a positive integer"),
        (["--stall-timeout-s", "-1"], "'-1': expected seconds > 0"),
    ],
)
def test_cli_refuses_bad_arguments_before_loading_anything(arguments, message):
    completed = subprocess.run([sys.executable, "-m", "pytest_afd.cli", "serve", *arguments],
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 2 and message in completed.stderr


def test_the_peer_timeout_comes_from_the_flag_else_the_environment():
    assert peer_timeout_from(4.0, {PEER_TIMEOUT_ENV: "9"}) == 4.0
    assert peer_timeout_from(None, {PEER_TIMEOUT_ENV: " 9 "}) == 9.0
    assert peer_timeout_from(None, {PEER_TIMEOUT_ENV: ""}) is None
    with pytest.raises(SystemExit, match=r"\$AFD_PEER_TIMEOUT_S='nan': 'nan': expected seconds"):
        peer_timeout_from(None, {PEER_TIMEOUT_ENV: "nan"})


def test_the_spec_passes_the_peer_timeout_to_the_server(tmp_path):
    spec = cpu_server_spec(RunSettings(afd_processes=True), name="s", log_dir=tmp_path,
                           topology=None, model_name="reduced", seed=0, peer_timeout_s=5.0)
    assert spec.argv[spec.argv.index("--afd-peer-timeout-s") + 1] == "5.0"
