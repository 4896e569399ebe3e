"""The README's launch example prints the RFC's token_balanced plan with clean headers."""

from pytest_afd.backends.vllm_ascend.launch import main

README_EXAMPLE = ["--npu-topology", "dp3pcp8-ep8", "--devices-per-node", "16",
                  "--model", "/models/dsv32-w8a8", "--node-address", "10.0.0.1",
                  "--node-address", "10.0.0.2", "--nic-name", "eth0"]


def test_the_token_balanced_plan_reads_cleanly(capsys):
    assert main([*README_EXAMPLE, "--split", "token_balanced"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0] == ("# dp3pcp8-ep8: 3 processes on 2 node(s), split=token_balanced "
                        "(the RFC's token-balanced split)")
    assert "# node 0 (10.0.0.1)" in lines and "# node 1 (10.0.0.2)" in lines
    assert not [line for line in lines if line.startswith("# #")]
    assert text.count('"async_moe_split": "token_balanced"') == 3
    assert text.count("VLLM_PLUGINS=ascend,afd,afd_split") == 3


def test_the_default_plan_says_it_is_the_control(capsys):
    assert main(README_EXAMPLE) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "split=request (request-boundary split: the control; --split token_balanced" in first
