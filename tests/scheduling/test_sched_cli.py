"""The afd-chunk-plan CLI: JSON fields, tables, workload files, exit codes."""

import json
import subprocess
import sys

import pytest

from pytest_afd.cli import main as cli_main
from pytest_afd.scheduling.cli import main


def run_json(capsys, *argv):
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def run_nonsense(capsys, *argv):
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_json_for_the_16388_example(capsys):
    code, doc = run_json(
        capsys, "--prompt-len", "16388", "--chunk", "8192", "--max-prefill-reqs", "1"
    )
    assert code == 0
    assert doc["valid"] is True and doc["reasons"] == []
    assert doc["effective_chunk"] == 8192
    assert doc["num_batches"] == 3
    assert doc["total_scheduled_tokens"] == 16388
    assert doc["forwards_per_request"] == [3]
    assert doc["chunks"] == [8192, 8192, 4]
    assert doc["rows_per_rank"] == {"first": [8192, 8192, 4], "max": 8192}
    assert doc["comm_rounds"]["first"] == [1, 1, 1] and doc["comm_rounds"]["max"] == 1
    assert doc["tail_batches"] == 1


def test_dp_folding_from_the_cli(capsys):
    _, doc = run_json(capsys, "--prompt-len", "16388", "--chunk", "16k", "--dp", "2")
    assert doc["global_chunk"] == 16384 and doc["effective_chunk"] == 8192


def test_ranks_give_dp(capsys):
    _, doc = run_json(
        capsys, "--prompt-len", "100", "--chunk", "24576", "--ranks", "24", "--cp", "8"
    )
    assert doc["dp_size"] == 3 and doc["effective_chunk"] == 8192
    # ceil(100 / 8) = 13 -> 16 rows per rank.
    assert doc["rows_per_rank"]["max"] == 16


def test_num_requests_cycles_the_prompt_lengths(capsys):
    _, doc = run_json(
        capsys,
        "--prompt-len",
        "100",
        "--prompt-len",
        "200",
        "--num-requests",
        "5",
        "--chunk",
        "8192",
    )
    assert doc["queue"]["total_prompt_tokens"] == 100 + 200 + 100 + 200 + 100
    assert doc["forwards_per_request"] == [1] * 5


def test_cached_prefix_is_realized_in_whole_pages(capsys):
    _, doc = run_json(
        capsys,
        "--prompt-len",
        "16388",
        "--chunk",
        "8192",
        "--max-prefill-reqs",
        "1",
        "--cached-prefix",
        "8200",
    )
    assert doc["queue"]["requested_cached_tokens"] == 8200
    assert doc["queue"]["realized_cached_tokens"] == 8192
    assert doc["queue"]["realized_cached_first"] == [8192]
    assert doc["chunks"] == [8192, 4]
    assert doc["total_scheduled_tokens"] == 16388 - 8192


def test_invalid_plan_exits_1_with_reason(capsys):
    code = main(["--prompt-len", "100", "--chunk", "8000"])
    out = capsys.readouterr().out
    assert code == 1
    assert "INVALID" in out and "8000" in out and "page size 128" in out


def test_human_table(capsys):
    code = main(["--prompt-len", "16388", "--chunk", "8192", "--max-prefill-reqs", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "8192 + 8192 + 4" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "rows/rank" in line and "fwd" in line)
    assert lines[header + 3].split() == ["2", "1", "4", "128", "4", "1", "tail"]


def test_sweep_table_flags_joint_candidates_and_omissions(capsys):
    code = main(
        [
            "--prompt-len",
            "16388",
            "--sweep",
            "8192,16384,32768,8000,unchunked",
            "--max-prefill-reqs",
            "1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "32768: JOINT candidate vs 16384" in out
    assert "8000: omitted:" in out


def test_sweep_json(capsys):
    code, doc = run_json(capsys, "--prompt-len", "16388", "--sweep", "8192,65536", "--dp", "3")
    assert code == 1  # neither size folds evenly by 3
    assert [c["plan"]["valid"] for c in doc["candidates"]] == [False, False]
    assert all(c["plan"]["reasons"] for c in doc["candidates"])


def test_jsonl_workload(tmp_path, capsys):
    path = tmp_path / "queue.jsonl"
    path.write_text('16388\n\n{"prompt_len": 1000, "cached_prefix": 512}\n')
    _, doc = run_json(capsys, "--workload", str(path), "--chunk", "8192", "--max-prefill-reqs", "1")
    assert doc["queue"]["num_requests"] == 2
    assert doc["queue"]["realized_cached_tokens"] == 512
    assert doc["queue"]["requested_cached_first"] == [0, 512]
    assert doc["queue"]["realized_cached_first"] == [0, 512]
    assert doc["total_scheduled_tokens"] == 16388 + 1000 - 512


def test_azure_csv_workload(tmp_path, capsys):
    path = tmp_path / "trace.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
    )
    _, doc = run_json(capsys, "--workload", str(path), "--num-requests", "1", "--chunk", "8192")
    assert doc["queue"]["total_prompt_tokens"] == 4808


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("16388\n-5\n", "queue.jsonl:2: prompt length -5"),
        ('{"tokens": 5}\n', "no 'prompt_len'"),
        ("abc\n", "queue.jsonl:1: not JSON"),
        ("", "holds no requests"),
        ('{"prompt_len": 10, "cached_prefix": -1}\n', "cached_prefix -1"),
    ],
)
def test_bad_jsonl_exits_2(tmp_path, capsys, content, message):
    path = tmp_path / "queue.jsonl"
    path.write_text(content)
    assert message in run_nonsense(capsys, "--workload", str(path), "--chunk", "8192")


def test_bad_csv_exits_2(tmp_path, capsys):
    path = tmp_path / "trace.csv"
    path.write_text("TIMESTAMP,ContextTokens\nx,0\n")
    assert "trace.csv:2: prompt length 0" in run_nonsense(
        capsys, "--workload", str(path), "--chunk", "8192"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompt-len", "100", "--chunk", "0"], "chunk '0'"),
        (["--prompt-len", "100", "--chunk", "abc"], "chunk 'abc'"),
        (["--prompt-len", "-5", "--chunk", "8192"], "'-5' must be a positive integer"),
        (["--prompt-len", "0", "--chunk", "8192"], "'0' must be a positive integer"),
        (
            ["--prompt-len", "100", "--chunk", "8192", "--cached-prefix", "200"],
            "cached prefix 200 is longer than request 0's prompt (100 tokens)",
        ),
        (
            ["--prompt-len", "100", "--chunk", "8192", "--ranks", "12", "--cp", "8"],
            "cp 8 does not divide the 12 ranks",
        ),
        (
            ["--prompt-len", "100", "--chunk", "8192", "--ranks", "16", "--cp", "8", "--dp", "3"],
            "dp 3 * cp 8 != 16 ranks",
        ),
        (["--prompt-len", "100", "--chunk", "8192", "--dp", "0"], "'0' must be a positive integer"),
        (["--prompt-len", "100", "--sweep", ","], "sweep ','"),
        (["--prompt-len", "100"], "--chunk"),
        (["--chunk", "8192"], "--prompt-len"),
        (["--workload", "/nonexistent/q.jsonl", "--chunk", "8192"], "does not exist"),
    ],
)
def test_nonsense_exits_2_naming_the_value(capsys, argv, message):
    assert message in run_nonsense(capsys, *argv)


def test_pytest_afd_chunk_plan_runs_the_planner(capsys):
    # The console scripts (pytest-afd, and afd-chunk-plan as its alias) are checked
    # against pyproject.toml in tests/cli/test_cli_aliases.py.
    assert cli_main(["chunk-plan", "--prompt-len", "100", "--chunk", "8192"]) == 0
    assert "valid: 1 forwards" in capsys.readouterr().out


def test_module_run_exits_2_on_nonsense():
    result = subprocess.run(
        [sys.executable, "-m", "pytest_afd.scheduling.cli", "--prompt-len", "100", "--chunk", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "chunk '0'" in result.stderr
