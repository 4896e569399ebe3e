"""The afd-split command line: JSON shape, metadata, and one-line errors with exit status 2."""

import json
import subprocess
import sys

import pytest

from afd_split.cli import EXIT_BAD_INPUT, main

ISSUE_EXAMPLE = [
    "plan",
    "--tokens",
    "4096,120,7000",
    "--computed",
    "0,0,512",
    "--policy",
    "token_balanced",
    "--align",
    "8",
    "--json",
]


def run_main(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_json_has_the_documented_fields(capsys):
    code, out, err = run_main(ISSUE_EXAMPLE, capsys)
    assert code == 0 and err == ""
    report = json.loads(out)
    assert report["policy"] == "token_balanced" and report["split_token"] == 5608
    head, tail = report["ubatches"]
    for entry in (head, tail):
        for key in (
            "token_start",
            "token_stop",
            "request_start",
            "request_stop",
            "num_real_tokens",
            "num_padded_tokens",
            "query_start_loc",
            "seq_lens",
            "num_computed_tokens",
        ):
            assert key in entry
    assert head["query_start_loc"] == [0, 4096, 4216, 5608]
    assert head["seq_lens"] == [4096, 120, 512 + 1392]
    assert tail["num_computed_tokens"] == [512 + 1392]
    assert tail["seq_lens"] == [7512]


def test_pcp_and_padding_options(capsys):
    code, out, _ = run_main(
        [
            "plan",
            "--tokens",
            "10,7,30",
            "--align",
            "2",
            "--pcp",
            "2",
            "--padded-total",
            "60",
            "--json",
        ],
        capsys,
    )
    report = json.loads(out)
    assert code == 0 and report["constraints"]["pcp_size"] == 2
    assert [u["num_padded_tokens"] for u in report["ubatches"]] == [28 - 24, 60 - 28 - 23]


def test_text_output(capsys):
    code, out, _ = run_main(["plan", "--tokens", "100,20,3000", "--align", "8"], capsys)
    assert code == 0 and "split_token=1560" in out and "ubatch 1" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tokens", "5,-1"], "--tokens[1]=-1"),
        (["--tokens", "5,6", "--computed", "1"], "--computed has 1 entries"),
        (["--tokens", "0"], "--tokens[0]=0"),
        (["--tokens", "5,6", "--align", "16"], "--align=16 is larger than the batch's 11"),
        (["--tokens", "5,6", "--align", "16", "--policy", "none"], "--align=16 is larger"),
        (["--tokens", "5,6", "--align", "11"], "align=11 is not below"),
        (["--tokens", "a,b"], "expected comma-separated integers"),
        (["--tokens", "4", "--policy", "halves"], "invalid choice: 'halves'"),
        (["--tokens", "4,4", "--align", "0"], "align must be an integer >= 1, got 0"),
        (["--tokens", "4,4", "--computed", "0,-3"], "num_computed_tokens[1]=-3"),
    ],
)
def test_bad_input_is_one_line_on_stderr_with_status_2(argv, message, capsys):
    code, out, err = run_main(["plan", *argv], capsys)
    assert code == EXIT_BAD_INPUT and out == ""
    assert err.count("\n") == 1 and message in err


def test_python_dash_m_entry_point():
    ok = subprocess.run(
        [sys.executable, "-m", "afd_split", *ISSUE_EXAMPLE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["split_token"] == 5608
    bad = subprocess.run(
        [sys.executable, "-m", "afd_split", "plan", "--tokens", "3,x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == EXIT_BAD_INPUT and bad.stderr.count("\n") == 1
