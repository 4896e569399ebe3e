"""afd-chunk-plan refuses inputs whose plan would run for minutes, at once and by name."""

import json
import time

import pytest

from pytest_afd.scheduling.cli import MAX_FORWARDS, MAX_NUM_REQUESTS, MAX_PROMPT_LEN, main

# A refusal is argument checking, not planning: far below the minutes a plan took.
REFUSAL_BUDGET_S = 30.0


def refused(capsys, *argv):
    started = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert time.monotonic() - started < REFUSAL_BUDGET_S
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompt-len", "99999999999999", "--chunk", "8192"],
         f"'99999999999999' is more than the limit {MAX_PROMPT_LEN}"),
        (["--prompt-len", "9" * 5000, "--chunk", "8192"], "is not an integer of at most 20 ASCII digits"),
        (["--prompt-len", "\u0663", "--chunk", "8192"], "is not an integer"),
        (["--prompt-len", "100", "--num-requests", str(MAX_NUM_REQUESTS + 1), "--chunk", "8k"],
         f"is more than the limit {MAX_NUM_REQUESTS}"),
        (["--prompt-len", "100", "--chunk", "8k", "--dp", "99999"], "'99999' is more than the limit 8192"),
        (["--prompt-len", "100", "--chunk", "9" * 5000], "expected a positive token count"),
        (["--prompt-len", str(MAX_PROMPT_LEN), "--num-requests", "64", "--chunk", "128",
          "--page-size", "128"], f"need at least 524288 forwards; the limit is {MAX_FORWARDS}"),
        (["--prompt-len", str(MAX_PROMPT_LEN), "--num-requests", "64", "--sweep", "8192,128"],
         "(chunk 128, --max-batched-tokens"),
    ],
)
def test_oversized_inputs_exit_2_naming_the_value(capsys, argv, message):
    assert message in refused(capsys, *argv)


def test_workload_file_lengths_are_bounded(tmp_path, capsys):
    path = tmp_path / "queue.jsonl"
    path.write_text(f"100\n{MAX_PROMPT_LEN + 1}\n")
    err = refused(capsys, "--workload", str(path), "--chunk", "8192")
    assert f"queue.jsonl:2: prompt length {MAX_PROMPT_LEN + 1} is more than the limit" in err


def test_inputs_at_the_limits_still_plan(capsys):
    assert main(["--prompt-len", str(MAX_PROMPT_LEN), "--chunk", "8192", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["queue"]["total_prompt_tokens"] == MAX_PROMPT_LEN
