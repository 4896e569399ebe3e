"""The shipped Azure LLM inference trace 2023 (CC-BY-4.0, see data/), read once per process."""

from __future__ import annotations

import csv
import datetime as dt
import functools
from dataclasses import dataclass
from importlib import resources

import numpy as np

from pytest_afd.workloads.spec import TRACE_NAMES

_TRACE_PACKAGE_DIR = "azure-llm-2023"
_TRACE_FILE = "AzureLLMInferenceTrace_{name}.csv"
_SECONDS_PER_DAY = 86400
_SECONDS_PER_HOUR = 3600
_SECONDS_PER_MINUTE = 60


@dataclass(frozen=True)
class Trace:
    """One shipped trace in arrival order; arrays are read-only."""

    name: str
    prompt_lengths: np.ndarray  # int64, ContextTokens
    output_lengths: np.ndarray  # int64, GeneratedTokens
    arrival_s: np.ndarray  # float64, seconds since the first request

    def __len__(self) -> int:
        return int(self.prompt_lengths.size)


def _parse_timestamp(text: str) -> tuple[int, float]:
    """``2023-11-16 18:17:03.9799600`` -> (day ordinal, seconds of day).

    Parsed by hand: 7 fractional digits break ``fromisoformat`` on Python 3.10,
    and keeping the day apart keeps sub-millisecond gaps exact in float64.
    """
    day_text, clock_text = text.strip().split(" ")
    hours, minutes, seconds = clock_text.split(":")
    seconds_of_day = int(hours) * _SECONDS_PER_HOUR + int(minutes) * _SECONDS_PER_MINUTE
    return dt.date.fromisoformat(day_text).toordinal(), seconds_of_day + float(seconds)


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@functools.lru_cache(maxsize=len(TRACE_NAMES))
def load_trace(name: str) -> Trace:
    """Read a shipped trace (``"conv"`` or ``"code"``); cached because suites reuse it."""
    if name not in TRACE_NAMES:
        raise ValueError(f"trace={name!r}; expected one of {TRACE_NAMES}")
    path = (
        resources.files("pytest_afd") / "data" / _TRACE_PACKAGE_DIR / _TRACE_FILE.format(name=name)
    )
    days, seconds, prompts, outputs = [], [], [], []
    with path.open("r", encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            day, second = _parse_timestamp(row["TIMESTAMP"])
            days.append(day)
            seconds.append(second)
            prompts.append(int(row["ContextTokens"]))
            outputs.append(int(row["GeneratedTokens"]))
    day_offsets = np.asarray(days, dtype=np.int64) - days[0]
    arrival = day_offsets * float(_SECONDS_PER_DAY) + (np.asarray(seconds) - seconds[0])
    return Trace(
        name=name,
        prompt_lengths=_read_only(np.asarray(prompts, dtype=np.int64)),
        output_lengths=_read_only(np.asarray(outputs, dtype=np.int64)),
        arrival_s=_read_only(arrival),
    )
