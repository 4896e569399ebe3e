"""Read the counters a vLLM-compatible server exposes on ``/metrics``.

The realized prefix-cache hit ratio must come from the runtime, not from how the
prompts were built (RFC Stage B), so the harness reads the server's token
counters before and after a phase and reports the ratio of the differences.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# vLLM V1 names (counters in tokens); older releases prefixed them with ``gpu_``.
PREFIX_CACHE_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_CACHE_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
REQUEST_SUCCESS = ("vllm:request_success_total",)
REQUESTS_RUNNING = ("vllm:num_requests_running",)
# vLLM V1 labels every finished request of request_success_total with its
# FinishReason (vllm/v1/metrics/loggers.py): aborted ones carry "abort".
FINISHED_REASON_LABEL = "finished_reason"
FINISHED_ABORT = "abort"

_SAMPLE_LINE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"(?:\{(?P<labels>.*)\})?"
    r"\s+(?P<value>\S+)(?:\s+\S+)?$"
)
_LABEL_PAIR = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')
_SPECIAL_VALUES = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}


class MetricsFormatError(ValueError):
    """A ``/metrics`` body is not Prometheus text exposition format."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _parse_labels(text: str, line: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    position = 0
    while position < len(text):
        match = _LABEL_PAIR.match(text, position)
        if match is None:
            raise MetricsFormatError(f"bad label set in metrics line {line!r}")
        value = match.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        pairs.append((match.group(1), value))
        position = match.end()
    return tuple(pairs)


def _parse_value(text: str, line: str) -> float:
    if text in _SPECIAL_VALUES:
        return _SPECIAL_VALUES[text]
    try:
        return float(text)
    except ValueError:
        raise MetricsFormatError(f"bad sample value {text!r} in metrics line {line!r}") from None


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a text-format exposition; comments and blank lines skipped."""
    samples = []
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE_LINE.match(line)
        if match is None:
            raise MetricsFormatError(f"not a Prometheus sample line: {line!r}")
        labels = _parse_labels(match.group("labels") or "", line)
        samples.append(Sample(match.group("name"), labels, _parse_value(match.group("value"), line)))
    return samples


def sum_metric(samples: Iterable[Sample], names: tuple[str, ...],
               where: Callable[[Sample], bool] | None = None) -> float | None:
    """Sum over all label sets of the first name in ``names`` that is present.

    Several engines (DP ranks) report one series each; the server total is the
    sum. ``where`` keeps only the samples it accepts (e.g. one finished_reason).
    """
    materialized = list(samples)
    for name in names:
        series = [sample for sample in materialized if sample.name == name]
        if series:
            return float(sum(sample.value for sample in series if where is None or where(sample)))
    return None


def _aborted(sample: Sample) -> bool:
    return dict(sample.labels).get(FINISHED_REASON_LABEL) == FINISHED_ABORT


@dataclass(frozen=True)
class ServerCounters:
    """Cumulative token/request counters read from one ``/metrics`` scrape."""

    prefix_cache_queries: float
    prefix_cache_hits: float
    prompt_tokens: float | None
    request_success: float | None  # finished requests, aborted ones excluded
    requests_running: float | None = None
    request_aborted: float | None = None  # finished_reason="abort"

    @classmethod
    def from_text(cls, text: str) -> ServerCounters:
        samples = parse_prometheus(text)
        queries = sum_metric(samples, PREFIX_CACHE_QUERIES)
        hits = sum_metric(samples, PREFIX_CACHE_HITS)
        if queries is None or hits is None:
            raise MetricsFormatError(
                f"metrics carry no prefix-cache counters (looked for {PREFIX_CACHE_QUERIES} "
                f"and {PREFIX_CACHE_HITS}); is prefix caching enabled on the server?"
            )
        return cls(
            prefix_cache_queries=queries,
            prefix_cache_hits=hits,
            prompt_tokens=sum_metric(samples, PROMPT_TOKENS),
            request_success=sum_metric(samples, REQUEST_SUCCESS,
                                       lambda sample: not _aborted(sample)),
            requests_running=sum_metric(samples, REQUESTS_RUNNING),
            request_aborted=sum_metric(samples, REQUEST_SUCCESS, _aborted),
        )


@dataclass(frozen=True)
class PrefixCacheDelta:
    queried_tokens: float
    hit_tokens: float

    @property
    def hit_ratio(self) -> float | None:
        """Realized hit ratio of the phase; None when nothing was queried."""
        if self.queried_tokens <= 0:
            return None
        return self.hit_tokens / self.queried_tokens


def prefix_cache_delta(before: ServerCounters, after: ServerCounters) -> PrefixCacheDelta:
    """Counters are cumulative: a phase's work is the difference of two scrapes."""
    queried = after.prefix_cache_queries - before.prefix_cache_queries
    hits = after.prefix_cache_hits - before.prefix_cache_hits
    if queried < 0 or hits < 0:
        raise MetricsFormatError(
            f"prefix-cache counters went backwards (queries {before.prefix_cache_queries} -> "
            f"{after.prefix_cache_queries}, hits {before.prefix_cache_hits} -> "
            f"{after.prefix_cache_hits}): the server restarted between the scrapes"
        )
    return PrefixCacheDelta(queried_tokens=queried, hit_tokens=hits)
