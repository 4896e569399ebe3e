"""The noise between sessions on one host, and the host conditions every verdict states.

Three repetitions inside one session say little about the next session on a
busy host: three ``pytest -m stage_d`` sessions of the same code at load 1.5–1.9
on 2 CPUs (docs/report.md, "Between-session noise") moved single cases by up to
x2.07 with repetition CVs of 2–40 %, and a stage's geometric mean by up to 14 %.
So a difference is called (a compare call, a stage's winner) only beyond the
between-session noise: a stored A/A calibration of this host when there is one
(``compare --calibrate RUN RUN [RUN...]``), otherwise the conservative rule
below, which the output states. Pure functions over result documents: the
plugin's terminal summary and the report share them without importing matplotlib.

Inside one session that rule is far too coarse: the cases of one comparison ran
their repetitions interleaved (``--afd-run-order interleaved``, the default), so
the session's drift hits both sides and each side's repetitions are a sample of
the same host. There :func:`within_session_beyond` calls a change from a 95 %
Welch interval of the ratio of geometric means (Welch's t on log values) plus a
minimum effect of :data:`WITHIN_MIN_EFFECT`: a 1.2x change is called when the
repetitions' dispersion allows it (tests/report/test_within_session_power.py
proves the A/A false-call rate and the power by seeded simulation).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# Uncalibrated per-case rule: the change must exceed this multiple of the larger
# coefficient of variation of the two sides' repetitions ...
UNCALIBRATED_CV_MULTIPLE = 5.0
# ... and this share, as a factor either way (x2 or x0.5): the A/A sessions above moved
# cases by x1.5–x2.07 at repetition CVs down to 2 %, so no CV multiple alone is safe.
UNCALIBRATED_MIN_FLOOR = 1.0
# Uncalibrated stage-wide rule: the geometric mean of a stage's per-case ratios must move
# further than this (the A/A sessions' stage geometric means moved by up to 14 %).
UNCALIBRATED_STAGE_FLOOR = 0.2
ONE_MINUTE = 0
UNCALIBRATED_RULE = (
    f"no A/A calibration of this host: a case's change must be a factor beyond "
    f"1 + {UNCALIBRATED_CV_MULTIPLE:g}x the larger coefficient of variation and beyond "
    f"x{1 + UNCALIBRATED_MIN_FLOOR:g} either way, with CPU time moving the same way as wall "
    "time; a stage-wide "
    f"change (geometric mean over its cases) must exceed {UNCALIBRATED_STAGE_FLOOR:.0%}, its "
    "95% interval over the cases must exclude 1 and CPU time must agree"
)
PROVISIONAL = "provisional"


def cv(values: Sequence[float]) -> float:
    """Sample coefficient of variation (0 for fewer than two values or a zero mean)."""
    if len(values) < 2:  # noqa: PLR2004 - a spread needs two values
        return 0.0
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(variance) / abs(mean) if mean else 0.0


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def uncalibrated_floor(a: Sequence[float], b: Sequence[float]) -> float:
    """The conservative per-case floor: max(multiple x larger CV, the minimum floor)."""
    return max(UNCALIBRATED_CV_MULTIPLE * max(cv(a), cv(b)), UNCALIBRATED_MIN_FLOOR)


def ranges_apart(a: Sequence[float], b: Sequence[float]) -> bool:
    return max(a) < min(b) or max(b) < min(a)


def outside(ratio: float, limit: float) -> bool:
    """Whether ``ratio`` is further from 1 than the factor ``1 + limit``, either way
    (x2 and x0.5 are equally far for ``limit`` 1)."""
    return ratio > 0 and abs(math.log(ratio)) > math.log1p(limit)


def beyond(a: Sequence[float], b: Sequence[float], floor: float | None = None) -> bool:
    """Whether median(b) / median(a) lies beyond the between-session noise.

    Both: the min-max ranges do not overlap, and the ratio is further from 1
    than ``floor`` (a calibrated floor) or, without one, :func:`uncalibrated_floor`.
    """
    if not a or not b or median(a) <= 0:
        return False
    ratio = median(b) / median(a)
    limit = uncalibrated_floor(a, b) if floor is None else max(floor, cv(a), cv(b))
    return ranges_apart(a, b) and outside(ratio, limit)


# --- within one session ------------------------------------------------------------------------
# A within-session change must be further from 1 than this factor either way, beside its
# interval excluding 1: smaller moves are real but too small to act on.
WITHIN_MIN_EFFECT = 0.05
# Two-sided 95 % Student-t quantiles t(0.975, df) for df = 1..30; beyond 30 the last
# (2.042 > 1.960) keeps the interval conservative. A non-integer Welch df rounds down.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
WITHIN_CONFIDENCE = 0.95
WITHIN_RULE = (
    f"within one session: {WITHIN_CONFIDENCE:.0%} Welch interval of the ratio of geometric "
    f"means (t on log values) excludes 1 and the ratio is beyond x{1 + WITHIN_MIN_EFFECT:g} "
    "either way"
)


def t_975(df: float) -> float:
    """t(0.975, floor(df)) from :data:`T_975` (df below 1 counts as 1)."""
    index = min(max(math.floor(df), 1), len(T_975)) - 1
    return T_975[index]


def _log_mean_var(values: Sequence[float]) -> tuple[float, float]:
    logs = [math.log(v) for v in values]
    mean = sum(logs) / len(logs)
    return mean, sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)


def welch_log_interval(a: Sequence[float], b: Sequence[float]
                       ) -> tuple[float, float, float] | None:
    """(B / A ratio of geometric means, 95 % low, high) by Welch's t on log values.

    None when either side has fewer than two positive values or neither side
    varies at all (no dispersion to judge a difference by).
    """
    if len(a) < 2 or len(b) < 2 or min(a) <= 0 or min(b) <= 0:  # noqa: PLR2004
        return None
    mean_a, var_a = _log_mean_var(a)
    mean_b, var_b = _log_mean_var(b)
    se_a, se_b = var_a / len(a), var_b / len(b)
    se = math.sqrt(se_a + se_b)
    if se == 0:
        return None
    df = (se_a + se_b) ** 2 / ((se_a**2 / (len(a) - 1) if se_a else 0.0)
                               + (se_b**2 / (len(b) - 1) if se_b else 0.0))
    diff, half = mean_b - mean_a, t_975(df) * se
    return math.exp(diff), math.exp(diff - half), math.exp(diff + half)


def within_session_beyond(a: Sequence[float], b: Sequence[float],
                          min_effect: float = WITHIN_MIN_EFFECT) -> bool:
    """Whether B differs from A inside one session: the Welch interval of B / A excludes
    1 and the ratio is further from 1 than ``1 + min_effect`` either way."""
    found = welch_log_interval(a, b)
    if found is None:
        return False
    ratio, low, high = found
    return (low > 1 or high < 1) and outside(ratio, min_effect)


def same_session(*docs: Mapping[str, Any]) -> bool:
    """Whether every document was written by one recorded session."""
    sessions = {doc.get("session_id") for doc in docs}
    return len(sessions) == 1 and None not in sessions


def beyond_noise(a: Sequence[float], b: Sequence[float], *, within: bool) -> bool:
    """:func:`within_session_beyond` for two sides of one session, else :func:`beyond`
    (the between-session rule)."""
    return within_session_beyond(a, b) if within else beyond(a, b)


# --- host conditions -------------------------------------------------------------------------
def host_readings(doc: Mapping[str, Any]) -> tuple[int, list[float]] | None:
    """(CPU count, every 1-minute load reading around each repetition); None when unrecorded."""
    host = doc.get("host")
    if not isinstance(host, Mapping) or not host.get("repetitions"):
        return None
    loads = [float(rep[key][ONE_MINUTE]) for rep in host["repetitions"]
             for key in ("load_before", "load_after")]
    return int(host["cpu_count"]), loads


def session_hosts(docs: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, float, float]]:
    """session id -> (CPU count, lowest, highest 1-minute load over its repetitions)."""
    found: dict[str, tuple[int, float, float]] = {}
    for doc in docs:
        readings = host_readings(doc)
        if readings is None:
            continue
        cpus, loads = readings
        session = str(doc.get("session_id") or "unknown")
        _, low, high = found.get(session, (cpus, min(loads), max(loads)))
        found[session] = (cpus, min(low, *loads), max(high, *loads))
    return found


def host_line(docs: Sequence[Mapping[str, Any]]) -> str:
    """``host: session s1 load 1.5–1.9 on 2 CPUs`` (every session), or that it was not recorded."""
    hosts = session_hosts(docs)
    if not hosts:
        return "host: load not recorded"
    parts = [f"session {session} load {low:.2g}–{high:.2g} on {cpus} CPUs"
             for session, (cpus, low, high) in sorted(hosts.items())]
    return "host: " + "; ".join(parts)


def oversubscribed_reason(docs: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a verdict is provisional: a repetition ran at a load above the CPU count."""
    worst = None
    for doc in docs:
        readings = host_readings(doc)
        if readings is None:
            continue
        cpus, loads = readings
        if max(loads) > cpus and (worst is None or max(loads) / cpus > worst[0] / worst[1]):
            worst = (max(loads), cpus)
    if worst is None:
        return None
    return (f"{PROVISIONAL}: the host was oversubscribed (1-minute load {worst[0]:.2g} on "
            f"{worst[1]} CPUs at a repetition): rerun on a quieter host to confirm")
