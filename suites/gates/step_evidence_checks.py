"""The step evidence's real and padded token counts, recomputed independently of afd_split.

Every step record (``RunOutputs.steps``) carries the plan's realized
per-ubatch real / padded tokens and rows. The gates do not trust them: the
real tokens are recomputed from the scheduler's own record of the step
(``schedule.num_scheduled_tokens``) and the recorded cut, the rows from the
recorded constraints by plain rounding (the documented padding rule: each
ubatch is rounded up to ``align`` rows; PCP and ``padded_total`` layouts are
checked for consistency only), with no afd_split code. A record that
reports padding rows as real tokens, or counts that do not add up to what
the scheduler ran, is a problem named by step and field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

UBATCH_KEYS = ("token_start", "token_stop", "num_real_tokens", "num_padded_tokens", "num_rows")
RECORD_KEYS = ("is_split", "split_token", "num_real_tokens", "num_padded_tokens", "num_rows",
               "constraints", "ubatches", "schedule")  # fmt: skip


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def expected_real_tokens(record: dict[str, Any]) -> list[int]:
    """Per ubatch real tokens: the scheduler's tokens of the step, cut at the recorded split."""
    total = sum(int(n) for n in record["schedule"]["num_scheduled_tokens"])
    if not record["is_split"]:
        return [total]
    cut = int(record["split_token"])
    return [cut, total - cut]


def step_count_problems(record: dict[str, Any], where: str) -> list[str]:
    """What is wrong with one step record's real / padded counts (empty: nothing)."""
    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        return [f"{where} lacks {missing}: the gate checks the real / padded counts from them"]
    problems = []
    ubatches = record["ubatches"]
    expected = expected_real_tokens(record)
    if len(ubatches) != len(expected):
        return [f"{where}: {len(ubatches)} ubatches recorded, the cut gives {len(expected)}"]
    constraints = record["constraints"]
    plain_rows = constraints["pcp_size"] == 1 and constraints["padded_total"] is None
    for index, (ubatch, real) in enumerate(zip(ubatches, expected, strict=True)):
        lacking = [key for key in UBATCH_KEYS if key not in ubatch]
        if lacking:
            problems.append(f"{where} ubatch {index} lacks {lacking}")
            continue
        label = f"{where} ubatch {index}"
        if ubatch["num_real_tokens"] != real:
            problems.append(f"{label}: num_real_tokens={ubatch['num_real_tokens']}, the "
                            f"schedule and cut give {real}")
        if ubatch["token_stop"] - ubatch["token_start"] != real:
            problems.append(f"{label}: tokens [{ubatch['token_start']}, {ubatch['token_stop']}) "
                            f"are not its {real} real tokens")
        if ubatch["num_padded_tokens"] != ubatch["num_rows"] - real:
            problems.append(f"{label}: num_padded_tokens={ubatch['num_padded_tokens']} but "
                            f"{ubatch['num_rows']} rows hold {real} real tokens")
        if plain_rows and ubatch["num_rows"] != _round_up(real, constraints["align"]):
            problems.append(f"{label}: num_rows={ubatch['num_rows']}, {real} real tokens "
                            f"rounded up to align {constraints['align']} give "
                            f"{_round_up(real, constraints['align'])}")
    totals = {
        "num_real_tokens": sum(expected),
        "num_rows": sum(u.get("num_rows", 0) for u in ubatches),
        "num_padded_tokens": sum(u.get("num_rows", 0) for u in ubatches) - sum(expected),
    }
    for key, value in totals.items():
        if record[key] != value:
            problems.append(f"{where}: {key}={record[key]}, the ubatches and schedule give {value}")
    return problems


def steps_count_problems(steps: Sequence[dict[str, Any]], case: str) -> list[str]:
    """``step_count_problems`` over a run's step records."""
    return [problem for index, record in enumerate(steps)
            for problem in step_count_problems(record, f"{case} step {index}")]


def agreement_problems(steps: Sequence[dict[str, Any]], case: str) -> list[str]:
    """AFD-process steps whose ranks did not all record one agreed plan fingerprint
    (the debug-mode agreement, ``afd_split.plan.agree``, must run on every step)."""
    problems = []
    for index, record in enumerate(steps):
        agreed = record.get("afd", {}).get("agreed_fingerprints")
        if not agreed:
            problems.append(f"{case} step {index}: no rank recorded the fingerprint agreement")
        elif len({tuple(fingerprints or ()) for fingerprints in agreed.values()}) != 1 or not all(
            agreed.values()
        ):
            problems.append(f"{case} step {index}: ranks recorded different agreements {agreed}")
    return problems
