"""What a printed launch plan may contain (issue 23, rows 5 and 16).

Row 5: every node address is an IP or a host name on every plan, and all text
in the plan is escaped, so running the plan runs only its commands. Row 16: each
API binds its node's address, takes its API key from the environment (the key
never appears in the plan), and the unauthenticated dev routes are on request.
"""

import shlex
import subprocess

import pytest

from pytest_afd.backends.vllm_ascend.launch import (
    LaunchOptions,
    LaunchPlanError,
    build_launch_plan,
    main,
)
from pytest_afd.backends.vllm_ascend.plan import comment

MODEL = "/m"
HOSTILE = ["10.0.0.1\ntouch X #", "10.0.0.1;id", "10.0.0.1 && id", "$(id)", "node-a.example.",
           "-rf", "a..b", "10.0.0.1\r", "ex\u0430mple.org", "1.2.3.300", ""]


@pytest.mark.parametrize("address", HOSTILE, ids=repr)
def test_addresses_that_are_not_ip_or_host_names_are_refused_on_every_plan(address, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--npu-topology", "dp1tp2-ep2", "--model", MODEL, f"--node-address={address}"])
    assert exit_info.value.code == 2
    assert "is neither an IP address nor a host name" in capsys.readouterr().err


@pytest.mark.parametrize("address", ["10.0.0.1", "::1", "node-a", "npu-07.cluster.example"])
def test_ip_addresses_and_host_names_are_accepted(address):
    plan = build_launch_plan("dp1tp2-ep2", LaunchOptions(model=MODEL, node_addresses=(address,)))
    assert plan.processes[0].additional_config()["afd"]["host"] == address


def test_the_printed_plan_runs_only_its_commands(tmp_path, capsys):
    """Run the printed plan with every command a no-op: nothing in it may execute anything
    else (before the fix, an address with a newline ran ``touch X`` from a comment)."""
    model = "/m'; touch $PWD/from-model #\n touch from-model2"
    assert main(["--npu-topology", "dp1tp2-ep2", "--model", model, "--node-address",
                 "10.0.0.1", "--attention-arg=--x=$(touch from-arg)"]) == 0
    script = capsys.readouterr().out
    run = subprocess.run(["bash", "-c", "env() { :; }\n" + script], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin",
                                                                           "VLLM_API_KEY": "k"})
    assert run.returncode == 0, run.stderr
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_comment_text_cannot_leave_its_comment():
    assert comment("a\nrm -rf x #") == "# a\\nrm -rf x #"
    assert "\n" not in comment("x\r\n\u2028y") and comment("x\u2028y").isascii()


def test_each_api_binds_its_node_and_reads_its_key_from_the_environment():
    plan = build_launch_plan("dp3pcp8-ep8", LaunchOptions(
        model=MODEL, devices_per_node=16, node_addresses=("10.0.0.1", "10.0.0.2"),
        socket_ifname="eth0"))
    for process in plan.processes:
        if process.headless:
            assert "--host" not in process.argv and process.env_arguments == ()
            continue
        assert process.flag_values("--host") == [process.node_address]
        assert "0.0.0.0" not in process.argv
        assert process.env_arguments == (("--api-key", "VLLM_API_KEY"),)
        assert '--api-key "${VLLM_API_KEY:?set VLLM_API_KEY first}"' in process.command_line()
        assert "VLLM_SERVER_DEV_MODE" not in dict(process.env)


def test_the_key_is_never_in_the_plan_and_an_unset_key_stops_the_shell(tmp_path):
    plan = build_launch_plan("dp1tp2-ep2", LaunchOptions(model=MODEL, node_addresses=("10.0.0.1",)))
    line = plan.processes[0].command_line()
    # Run the line with `vllm` echoing its arguments: the shell fills in the key at run time.
    echo = line.replace(" vllm serve", " echo serve", 1)
    ran = subprocess.run(["bash", "-c", echo], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin", "VLLM_API_KEY": "s3cret"})
    assert ran.returncode == 0 and ran.stdout.split()[-2:] == ["--api-key", "s3cret"]
    assert "s3cret" not in line
    unset = subprocess.run(["bash", "-c", echo], capture_output=True, text=True, timeout=30,
                           env={"PATH": "/usr/bin:/bin"})
    assert unset.returncode != 0 and "set VLLM_API_KEY first" in unset.stderr
    assert "serve" not in unset.stdout


def test_dev_mode_only_on_request_and_no_key_only_on_loopback():
    dev = build_launch_plan("dp1tp2-ep2", LaunchOptions(model=MODEL, node_addresses=("10.0.0.1",),
                                                        dev_mode=True))
    assert dict(dev.api_process.env)["VLLM_SERVER_DEV_MODE"] == "1"
    with pytest.raises(LaunchPlanError, match=r"no API key for APIs bound to \['10.0.0.1'\]"):
        build_launch_plan("dp1tp2-ep2", LaunchOptions(model=MODEL, node_addresses=("10.0.0.1",),
                                                      api_key_env=None))
    loopback = build_launch_plan("dp1tp2-ep2", LaunchOptions(
        model=MODEL, node_addresses=("127.0.0.1",), api_key_env=None))
    assert all(process.env_arguments == () for process in loopback.processes)
    with pytest.raises(LaunchPlanError, match=r"api_key_env='KEY; id' \(--api-key-env\)"):
        build_launch_plan("dp1tp2-ep2", LaunchOptions(model=MODEL, node_addresses=("10.0.0.1",),
                                                      api_key_env="KEY; id"))


def test_cli_flags_for_key_and_dev_mode(capsys):
    assert main(["--npu-topology", "dp1tp2-ep2", "--model", MODEL, "--node-address", "10.0.0.1",
                 "--api-key-env", "CLUSTER_KEY", "--dev-mode"]) == 0
    text = capsys.readouterr().out
    assert '"${CLUSTER_KEY:?set CLUSTER_KEY first}"' in text and "VLLM_SERVER_DEV_MODE=1" in text
    assert shlex.split(text.splitlines()[-1])[0] == "env"
