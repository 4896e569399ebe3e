"""The overlap benchmark's verdicts: paired ratios, bootstrap intervals, noise floor, met flags.

Fed with synthetic step times (no runtime), so each verdict is seen to flip.
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

STATS_FILE = Path(__file__).parents[2] / "benchmarks" / "afd_overlap_stats.py"


@pytest.fixture(scope="module")
def stats():
    spec = importlib.util.spec_from_file_location("afd_overlap_stats", STATS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _noisy(base, rounds, spread, seed):
    """Step times of one policy: a base time plus load that every policy of a round shares."""
    load = np.random.default_rng(seed).uniform(1.0, 1.0 + spread, rounds)
    return (base * load).tolist()


def test_shared_load_cancels_in_paired_ratios(stats):
    rb = _noisy(1.0, 20, spread=1.0, seed=1)
    tb = [0.7 * t for t in rb]
    ratio = stats.paired_ratio(tb, rb, seed=0)
    assert ratio["median"] == pytest.approx(0.7)
    assert ratio["ci95"] == pytest.approx([0.7, 0.7])
    target = stats.ratio_target("tb/rb", ratio, 0.85, where="m")
    assert target["met"] is True


def test_ratio_target_needs_interval_clear_of_one(stats):
    rb = [1.0] * 9
    tb = [0.5, 1.3] * 4 + [0.5]  # a median of 0.5 that four rounds out of nine contradict
    ratio = stats.paired_ratio(tb, rb, seed=0)
    assert ratio["median"] == 0.5 and ratio["ci95"][1] >= 1.0
    assert stats.ratio_target("tb/rb", ratio, 0.85, where="m")["met"] is False
    assert stats.inside_noise(ratio, floor=None) is True
    assert stats.ratio_target("tb/rb", None, 0.85, where="m")["met"] is False


def test_identical_plans_target_and_noise_floor(stats):
    close = stats.paired_ratio([1.02, 0.99, 1.01], [1.0, 1.0, 1.0], seed=0)
    far = stats.paired_ratio([1.2, 1.3, 1.25], [1.0, 1.0, 1.0], seed=0)
    assert stats.identical_plans_target({"a": close}, 0.05)["met"] is True
    verdict = stats.identical_plans_target({"a": close, "b": far}, 0.05)
    assert verdict["met"] is False and verdict["worst_pair"] == "b"
    floor = stats.noise_floor([close, far])
    assert floor == pytest.approx(0.3)
    small_win = stats.paired_ratio([0.8, 0.8, 0.8], [1.0, 1.0, 1.0], seed=0)
    assert stats.inside_noise(small_win, floor) is True
    assert stats.inside_noise(small_win, stats.noise_floor([close])) is False


def test_load_target_and_unequal_rounds(stats):
    assert stats.load_target((1.5, 3.0, 3.0), 2.0)["met"] is True
    assert stats.load_target((2.5, 1.0, 1.0), 2.0)["met"] is False
    with pytest.raises(ValueError, match="equally many rounds"):
        stats.paired_ratio([1.0, 2.0], [1.0], seed=0)


def test_dispersion_of_one_sample(stats):
    one = stats.dispersion([0.5])
    assert one["median"] == one["min"] == one["max"] == 0.5 and one["iqr"] == 0


def _step(seconds, attention_cpu, switches):
    return {
        "step_time_s": seconds,
        "cpu_time_s": {"Attention rank 0": attention_cpu, "FFN rank 0": attention_cpu / 2},
        "involuntary_switches": {"Attention rank 0": switches, "FFN rank 0": 0},
    }


def test_round_record_keeps_the_least_disturbed_step(stats):
    steps = [_step(0.9, 0.40, 30), _step(0.5, 0.35, 2), _step(0.7, 0.36, 10)]
    record = stats.round_record(steps)
    assert record["step_time_s"] == 0.5
    assert record["step_times_s"] == [0.9, 0.5, 0.7]
    assert record["cpu_time_s"] == {"Attention rank 0": 0.35, "FFN rank 0": 0.175}
    assert record["involuntary_switches"]["Attention rank 0"] == 10
    with pytest.raises(ValueError, match="at least one step"):
        stats.round_record([])


def test_minimum_of_k_removes_one_sided_interference(stats):
    """A disturbed step in every round dilutes per-step ratios; the round minimum does not."""
    rng = np.random.default_rng(3)
    rounds = 12
    rb_rounds, tb_rounds = [], []
    for _ in range(rounds):
        clean = rng.integers(0, 3, size=2)  # which of the 3 steps of each case ran undisturbed
        rb = [1.0 if i == clean[0] else 1.0 + rng.uniform(0.5, 1.0) for i in range(3)]
        tb = [0.7 if i == clean[1] else 0.7 + rng.uniform(0.5, 1.0) for i in range(3)]
        rb_rounds.append(stats.round_record([_step(t, t / 2, 0) for t in rb]))
        tb_rounds.append(stats.round_record([_step(t, t / 2, 0) for t in tb]))
    ratio = stats.paired_ratio(
        [r["step_time_s"] for r in tb_rounds], [r["step_time_s"] for r in rb_rounds], seed=0
    )
    assert ratio["median"] == pytest.approx(0.7)
    assert stats.ratio_target("tb/rb", ratio, 0.85, where="m")["met"] is True


def test_cpu_replay_keeps_dependencies_and_drops_lost_core_time():
    import sys

    sys.path.insert(0, str(STATS_FILE.parent))
    try:
        from afd_overlap_evidence import cpu_replay_s
    finally:
        sys.path.remove(str(STATS_FILE.parent))
    from pytest_afd.backends.cpu.afd.evidence import Span

    def span(rank, kind, start, end, cpu, peer):
        return Span(rank, kind, 3, 0, start, end, peer, cpu)

    # Attention (rank 0) computes 2 s of CPU in 6 s of wall (it lost its core), dispatches,
    # waits for the FFN (rank 1: 3 s of expert CPU), then combines 1 s.
    attention = [span(0, "attention", 0, 6, 2.0, -1), span(0, "dispatch", 6, 6, 0.0, 1),
                 span(0, "wait", 6, 10, 0.0, 1), span(0, "combine", 10, 11, 1.0, -1)]
    ffn = [span(1, "ffn_idle", 0, 6, 0.0, 0), span(1, "routed_moe", 6, 9, 3.0, -1),
           span(1, "send", 9, 10, 0.0, 0)]
    assert cpu_replay_s({0: attention, 1: ffn}) == pytest.approx(6.0)
    with pytest.raises(ValueError, match="wait for a send"):
        cpu_replay_s({0: attention, 1: ffn[:2]})
