"""Repetition protocol and dispersion statistics."""

import math

import pytest

from pytest_afd.stats.repetitions import execution_order, run_repeated, summarize


def test_plugin_summarize_values():
    stats = summarize([1.0, 2.0, 3.0, 4.0])
    assert stats.n == 4
    assert stats.median == 2.5
    assert (stats.min, stats.max, stats.mean) == (1.0, 4.0, 2.5)
    assert math.isclose(stats.stddev, 1.2909944487358056)
    assert stats.iqr == 1.5
    assert math.isclose(stats.cv, 1.2909944487358056 / 2.5)


def test_plugin_summarize_edge_cases():
    assert summarize([0.0, 0.0, 0.0]).cv is None
    assert summarize([5.0]).stddev == 0.0
    with pytest.raises(ValueError, match="empty"):
        summarize([])
    with pytest.raises(ValueError, match="non-finite"):
        summarize([1.0, float("nan")])


def test_plugin_execution_orders():
    assert execution_order(["a", "b"], 2, "fixed", 0) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert execution_order(["a", "b"], 2, "interleaved", 0) == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    first = execution_order(["a", "b", "c"], 3, "random", 7)
    assert first == execution_order(["a", "b", "c"], 3, "random", 7)
    assert sorted(first) == sorted(execution_order(["a", "b", "c"], 3, "fixed", 0))
    assert first != execution_order(["a", "b", "c"], 3, "random", 8)
    with pytest.raises(ValueError, match="run_order='sorted'"):
        execution_order(["a"], 3, "sorted", 0)


def test_plugin_run_repeated_warmup_and_order():
    calls = []

    def case(name, value):
        def run():
            calls.append(name)
            return {"tokens_per_s": value + len(calls)}

        return run

    run = run_repeated({"a": case("a", 0), "b": case("b", 100)}, repetitions=3, warmups=2,
                       run_order="interleaved", seed=3)
    assert calls[:4] == ["a", "a", "b", "b"]  # warmups first, discarded
    assert calls[4:] == ["a", "b"] * 3
    assert run.values["a"]["tokens_per_s"] == [5.0, 7.0, 9.0]
    assert run.stats("b", "tokens_per_s").median == 108.0
    assert run.protocol_json() == {
        "seed": 3, "warmups": 2, "repetitions": 3, "run_order": "interleaved",
        "executed_order": ["a#0", "b#0", "a#1", "b#1", "a#2", "b#2"],
    }


def test_plugin_run_repeated_requires_three_repetitions():
    with pytest.raises(ValueError, match="at least 3"):
        run_repeated({"a": lambda: 1.0}, repetitions=2)
    with pytest.raises(TypeError, match="returned str"):
        run_repeated({"a": lambda: "fast"})
