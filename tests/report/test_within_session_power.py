"""Within one session a 1.2x change is called when the repetitions allow it; A/A is not.

The between-session rule (:func:`pytest_afd.stats.session_noise.beyond`) needs x2 and
can never call 1.2x. Inside one session the repetitions of both sides were
interleaved on the same host, so :func:`~pytest_afd.stats.session_noise.within_session_beyond`
(a Welch interval on log values plus a 5 % minimum effect) decides. Proven by
seeded simulation, no timing: per-repetition throughput is lognormal with a CV of
2-8 % and, in the "spiky" model, a 10 % chance per repetition of a contention
burst that costs x1.1-x1.5 (what other processes on a 2-CPU host do).
"""

import math

import numpy as np
import pytest

from pytest_afd.stats import conclusions, session_noise, verdicts
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_result, stamped

TRIALS = 2000
SEED = 40
MAX_FALSE_CALLS = 0.05
SPIKE_PROBABILITY = 0.1
SPIKE_COST = (1.1, 1.5)


def _draw(rng, n, cv, spikes):
    """``n`` repetitions' throughput around 1."""
    values = np.exp(rng.normal(0.0, math.log1p(cv), n))
    if spikes:
        hit = rng.random(n) < SPIKE_PROBABILITY
        values = values / np.where(hit, rng.uniform(*SPIKE_COST, n), 1.0)
    return [float(v) for v in values]


def _call_rate(n, cv, factor, *, spikes, rule=session_noise.within_session_beyond):
    rng = np.random.default_rng(SEED)
    calls = 0
    for _ in range(TRIALS):
        a = _draw(rng, n, cv, spikes)
        b = [v * factor for v in _draw(rng, n, cv, spikes)]
        calls += rule(a, b)
    return calls / TRIALS


@pytest.mark.parametrize("spikes", [False, True])
@pytest.mark.parametrize("cv", [0.02, 0.05, 0.08])
@pytest.mark.parametrize("n", [3, 5])
def test_a_a_pairs_are_called_at_most_5_percent_of_the_time(n, cv, spikes):
    assert _call_rate(n, cv, 1.0, spikes=spikes) <= MAX_FALSE_CALLS


@pytest.mark.parametrize(("n", "cv", "spikes", "factor", "power"), [
    (3, 0.02, False, 1.2, 0.95),
    (3, 0.05, False, 1.2, 0.70),
    (5, 0.05, False, 1.2, 0.95),
    (5, 0.05, False, 1 / 1.2, 0.95),
    (5, 0.08, False, 1.2, 0.80),
    (5, 0.05, True, 1.2, 0.60),
])  # fmt: skip
def test_a_1_2x_change_is_called_when_the_dispersion_allows(n, cv, spikes, factor, power):
    assert _call_rate(n, cv, factor, spikes=spikes) >= power
    # The between-session rule (x2 at least) never calls it: what verdicts used before.
    assert _call_rate(n, cv, factor, spikes=spikes, rule=session_noise.beyond) == 0


def test_the_welch_interval_on_log_values():
    # logs: a = ln(1, 1.1, 1.2), b = a + ln 1.5: same variance, exact difference ln 1.5.
    a = [1.0, 1.1, 1.2]
    ratio, low, high = session_noise.welch_log_interval(a, [v * 1.5 for v in a])
    assert ratio == pytest.approx(1.5)
    logs = [math.log(v) for v in a]
    mean = sum(logs) / 3
    se = math.sqrt(2 * sum((x - mean) ** 2 for x in logs) / 2 / 3)
    # Equal variances and sizes: Welch df = 4, t(0.975, 4) = 2.776.
    assert low == pytest.approx(1.5 * math.exp(-2.776 * se))
    assert high == pytest.approx(1.5 * math.exp(2.776 * se))
    assert session_noise.welch_log_interval([1.0], [1.0, 2.0]) is None
    assert session_noise.welch_log_interval([1.0, 1.0], [2.0, 2.0]) is None  # no dispersion
    assert session_noise.t_975(2.9) == 4.303 and session_noise.t_975(500) == 2.042


def test_a_1_04x_change_with_tiny_noise_stays_below_the_minimum_effect():
    a = [1.0, 1.001, 0.999]
    assert not session_noise.within_session_beyond(a, [v * 1.04 for v in a])
    assert session_noise.within_session_beyond(a, [v * 1.06 for v in a])


def _pair(control_wall, proposed_wall, sessions, spread=0.01):
    workload = make_workload("bimodal", **SMALL)
    node = "suites/stage_c/test_stage_c_distributions.py::test_stage_c[x]/bimodal/fixed"
    return [stamped(make_result(f"{node}/{policy}", "stage_c", workload, policy, wall_s=wall,
                                spread=spread),
                    "passed", session=session, created_at="2026-12-07T10:00:00+00:00")
            for policy, wall, session in (("request_boundary", control_wall, sessions[0]),
                                          ("token_balanced", proposed_wall, sessions[1]))]


def test_the_verdicts_call_1_2x_inside_one_session_and_not_across_sessions():
    within = _pair(1.2, 1.0, ("s1", "s1"))
    [(_, ratio, mark)] = verdicts.policy_ratios(within)
    assert ratio == pytest.approx(1.2) and mark == verdicts.BEYOND_NOISE
    [row] = conclusions.fastest_rows(within)
    assert row.fastest == "token_balanced" and row.call == conclusions.WINNER
    across = _pair(1.2, 1.0, ("s1", "s2"))
    assert verdicts.policy_ratios(across)[0][2] == verdicts.INSIDE_NOISE
    assert conclusions.fastest_rows(across)[0].call == conclusions.INSIDE
    # Inside one session, a 1.2x move inside a 20 %-per-repetition spread is not called.
    assert verdicts.policy_ratios(_pair(1.2, 1.0, ("s1", "s1"), spread=0.2))[0][2] == (
        verdicts.INSIDE_NOISE)
