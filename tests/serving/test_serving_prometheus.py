"""Prometheus text parsing and the realized prefix-cache hit ratio from counter deltas."""

import math

import pytest

from pytest_afd.serving.prometheus import (
    MetricsFormatError,
    PrefixCacheDelta,
    ServerCounters,
    parse_prometheus,
    prefix_cache_delta,
)

# Shaped like vLLM V1 /metrics with two DP engines reporting separately.
VLLM_METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="deepseek_v3_2"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="deepseek_v3_2"} 3000.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="deepseek_v3_2"} 250.0
vllm:prefix_cache_hits_total{engine="1",model_name="deepseek_v3_2"} 750.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="deepseek_v3_2"} 4.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="deepseek_v3_2"} 4 1700000000000
vllm:weird{path="a \\"quoted\\" value"} NaN
"""


def test_parse_labels_values_and_special_numbers():
    samples = parse_prometheus(VLLM_METRICS)
    by_name = {}
    for sample in samples:
        by_name.setdefault(sample.name, []).append(sample)
    assert dict(by_name["vllm:prefix_cache_hits_total"][1].labels) == {
        "engine": "1", "model_name": "deepseek_v3_2"}
    bucket = by_name["vllm:time_to_first_token_seconds_bucket"][0]
    assert dict(bucket.labels)["le"] == "+Inf" and bucket.value == 4.0  # timestamp ignored
    weird = by_name["vllm:weird"][0]
    assert dict(weird.labels)["path"] == 'a "quoted" value' and math.isnan(weird.value)


def test_counters_sum_over_engines():
    counters = ServerCounters.from_text(VLLM_METRICS)
    assert (counters.prefix_cache_queries, counters.prefix_cache_hits) == (4000.0, 1000.0)
    assert counters.request_success == 4.0 and counters.prompt_tokens is None


def test_legacy_gpu_prefixed_names_are_read():
    text = ("vllm:gpu_prefix_cache_queries_total 10\n"
            "vllm:gpu_prefix_cache_hits_total 5\n")
    assert ServerCounters.from_text(text).prefix_cache_hits == 5.0


def test_hit_ratio_is_the_delta_between_scrapes():
    before = ServerCounters(1000.0, 100.0, None, None)
    after = ServerCounters(5000.0, 2100.0, None, None)
    delta = prefix_cache_delta(before, after)
    assert delta == PrefixCacheDelta(4000.0, 2000.0) and delta.hit_ratio == 0.5
    assert prefix_cache_delta(before, before).hit_ratio is None
    with pytest.raises(MetricsFormatError, match="restarted"):
        prefix_cache_delta(after, before)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vllm:x{engine=0} 1\n", "bad label set"),
        ("vllm:x one\n", "bad sample value"),
        ("{} 1\n", "not a Prometheus sample line"),
        ("vllm:prompt_tokens_total 3\n", "no prefix-cache counters"),
    ],
)
def test_malformed_metrics_fail_clearly(text, message):
    with pytest.raises(MetricsFormatError, match=message):
        ServerCounters.from_text(text)


def test_aborted_requests_are_read_apart_from_successes():
    """vLLM V1 labels aborted requests finished_reason="abort" under request_success_total."""
    text = (
        'vllm:prefix_cache_queries_total{engine="0"} 10.0\n'
        'vllm:prefix_cache_hits_total{engine="0"} 0.0\n'
        'vllm:request_success_total{engine="0",finished_reason="length"} 4.0\n'
        'vllm:request_success_total{engine="0",finished_reason="stop"} 1.0\n'
        'vllm:request_success_total{engine="0",finished_reason="abort"} 6.0\n'
        'vllm:request_success_total{engine="1",finished_reason="abort"} 1.0\n'
    )
    counters = ServerCounters.from_text(text)
    assert counters.request_success == 5.0 and counters.request_aborted == 7.0
