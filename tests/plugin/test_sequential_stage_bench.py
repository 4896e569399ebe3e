"""sequential_stage_bench's verdict comparison and replay, on hand-made result documents
(the bench itself runs the stages: minutes, so never in the default run)."""

import math

from tests.support.bench_module import bench_fixture

bench = bench_fixture("sequential_stage_bench")


def test_agreement_counts_calls_and_no_calls(bench):
    assert bench.agreement("higher", "higher") == "same"
    assert bench.agreement("higher", "lower") == "opposite"
    assert bench.agreement("equivalent", "undecided") == "same"  # neither calls a change
    assert bench.agreement("undecided", "undecided") == "same"
    assert bench.agreement("lower", "undecided") == "sequential_only"
    assert bench.agreement("equivalent", "higher") == "fixed_only"
    assert bench.agreement("higher", None) == "no_fixed"


def _doc(values):
    return {"metrics": {"wall_time_s": {"repetitions": values}}}


def test_replay_runs_the_rule_on_the_fixed_data_and_counts_each_case_once(bench):
    base = [1.0 + 0.01 * ((i * 7) % 5) for i in range(11)]
    docs = {"n/ref": _doc(base),
            "n/slow": _doc([2 * v * (1 + 0.01 * (i % 3)) for i, v in enumerate(base)]),
            "n/same": _doc([v * (1 + 0.005 * ((i % 3) - 1)) for i, v in enumerate(base)]),
            "n/lone": _doc(base)}
    rows = [{"a": "n/ref", "b": "n/slow"}, {"a": "n/ref", "b": "n/same"}]
    replayed = bench.replay(docs, rows, fixed_repeats=11)
    slow = replayed["verdicts"][("n/ref", "n/slow")]
    same = replayed["verdicts"][("n/ref", "n/same")]
    assert (slow.verdict, slow.repetitions) == ("higher", 3)
    assert same.verdict == "equivalent" and same.repetitions <= 11
    # ref measures until its last comparison stops, lone gets the first look.
    assert replayed["repetitions"] == max(3, same.repetitions) + 3 + same.repetitions + 3
    assert replayed["design"]["max_repetitions"] == 11
    assert math.isclose(replayed["design"]["alpha"], 0.045)


def test_fixed_interval_is_the_geometric_mean_ratio_with_its_t_interval(bench):
    """Checked against scipy's own one-sample t interval on the log-ratios."""
    import math

    from scipy import stats

    a = [1.0, 1.1, 0.9, 1.05, 0.95]
    b = [1.2, 1.3, 1.0, 1.3, 1.1]
    logs = [math.log(y / x) for x, y in zip(a, b, strict=True)]
    low, high = stats.t.interval(0.95, len(logs) - 1, loc=sum(logs) / len(logs),
                                 scale=stats.sem(logs))
    found = bench.fixed_interval(a, b)
    assert found["ratio"] == round(math.exp(sum(logs) / len(logs)), 4)
    assert found["interval_95"] == [round(math.exp(low), 4), round(math.exp(high), 4)]
    assert found["interval_95"][0] > 1.0  # a call the fixed test makes: b is higher
