"""Stage A analysis: rank the policies (a winner only beyond noise), correlate imbalance with cost.

Pure functions over measured numbers, so they are unit-tested without a backend.
A policy is named best only when the bootstrap interval of its score over the
runner-up's (resampling the repetitions) lies entirely above 1 and the lead
exceeds the between-session noise (a score is a geometric mean over workloads,
so the stage-wide floor of :mod:`pytest_afd.stats.session_noise` applies); otherwise the
ranking records "no significant difference" and the confirmation runs keep
the controls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pytest_afd.core.absent import absent, is_absent
from pytest_afd.stats.repetitions import CONFIDENCE, bootstrap_interval
from pytest_afd.stats.session_noise import UNCALIBRATED_STAGE_FLOOR

BASELINE_POLICY = "none"  # no async MoE dual batching
CONTROL_POLICY = "request_boundary"  # the current two-stage split
CANDIDATE_POLICY = "token_balanced"  # the RFC's proposal
POLICIES = (BASELINE_POLICY, CONTROL_POLICY, CANDIDATE_POLICY)
# A correlation needs at least this many points to mean anything.
MIN_CORRELATION_POINTS = 3
# Step evidence an AFD backend's instrumented steps carry (docs/afd-runtime.md names).
AFD_OVERLAP_KEYS = ("overlap_fraction", "straggler_s", "exposed_bubble_s")


def relative_throughput(
    throughput: Mapping[tuple[str, str], float],
) -> dict[tuple[str, str], float]:
    """(workload, policy) -> throughput / the workload's baseline throughput."""
    relative = {}
    for (workload, policy), value in throughput.items():
        baseline = throughput.get((workload, BASELINE_POLICY))
        if baseline is None or baseline <= 0:
            raise ValueError(
                f"workload {workload!r} has no positive {BASELINE_POLICY!r} throughput"
            )
        relative[(workload, policy)] = value / baseline
    return relative


def policy_scores(throughput: Mapping[tuple[str, str], float]) -> dict[str, float]:
    """Geometric mean over workloads of each policy's throughput relative to the baseline."""
    relative = relative_throughput(throughput)
    policies = sorted({policy for _, policy in relative})
    scores = {}
    for policy in policies:
        values = [v for (_, p), v in relative.items() if p == policy]
        scores[policy] = math.exp(sum(math.log(v) for v in values) / len(values))
    return scores


def pick_winner(throughput: Mapping[tuple[str, str], float]) -> str:
    """The policy with the best geometric-mean relative throughput (ties: name order)."""
    scores = policy_scores(throughput)
    return max(sorted(scores), key=lambda policy: scores[policy])


NO_SIGNIFICANT_DIFFERENCE = "no significant difference"
NOISE_METHOD = "percentile bootstrap over the repetitions (score ratio of leader to runner-up)"


def rank_policies(repetitions: Mapping[tuple[str, str], Sequence[float]], *, seed: int = 0
                  ) -> dict[str, Any]:
    """Scores from the medians, and a winner only when the lead exceeds the repetitions' noise.

    ``repetitions``: (workload, policy) -> measured throughputs. The lead is
    significant when the ``CONFIDENCE`` bootstrap interval of score(leader) /
    score(runner-up) excludes 1.
    """
    medians = {key: float(np.median(values)) for key, values in repetitions.items()}
    scores = policy_scores(medians)
    order = sorted(sorted(scores), key=lambda policy: -scores[policy])
    leader, runner_up = order[0], order[1] if len(order) > 1 else None
    ranking: dict[str, Any] = {"scores": scores, "leader": leader, "runner_up": runner_up}
    if runner_up is None:
        return {**ranking, "winner": leader, "significant": True, "verdict": f"{leader} only"}
    low, high = bootstrap_interval(
        repetitions, lambda m: _ratio(policy_scores(m), leader, runner_up), seed=seed
    )
    ratio = _ratio(scores, leader, runner_up)
    significant = low > 1.0 and ratio - 1 > UNCALIBRATED_STAGE_FLOOR
    return {
        **ranking,
        "winner": leader if significant else None,
        "significant": significant,
        "verdict": f"{leader} is best" if significant else NO_SIGNIFICANT_DIFFERENCE,
        "leader_vs_runner_up": {
            "ratio": ratio, "interval": [low, high],
            "confidence": CONFIDENCE, "method": NOISE_METHOD,
            "between_session_floor": UNCALIBRATED_STAGE_FLOOR,
        },
    }  # fmt: skip


def _ratio(scores: Mapping[str, float], leader: str, runner_up: str) -> float:
    return scores[leader] / scores[runner_up]


def confirmation_policies(winner: str | None) -> tuple[str, ...]:
    """The split policies repeated on the full model (the baseline always runs as well).

    A significant winner other than the baseline or the control is confirmed
    against the control; otherwise (no significant difference, or the
    baseline or control won) the controls are kept: control and proposal.
    """
    if winner in (None, BASELINE_POLICY, CONTROL_POLICY):
        return (CONTROL_POLICY, CANDIDATE_POLICY)
    return (CONTROL_POLICY, winner)


def confirmation_case_policies(winner: str | None) -> tuple[str, ...]:
    """Every policy of the confirmation run: the baseline first, each policy once."""
    return tuple(dict.fromkeys((BASELINE_POLICY, *confirmation_policies(winner))))


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson r; None when there are too few points or either side is constant."""
    if len(xs) != len(ys):
        raise ValueError(f"pearson: {len(xs)} x values but {len(ys)} y values")
    if len(xs) < MIN_CORRELATION_POINTS:
        return None
    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def _measured(value: Any) -> bool:
    """A number the step measured: not an absent record (unknown is never averaged as 0)."""
    return value is not None and not is_absent(value)


def afd_overlap(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Mean overlap / straggler / bubble over the steps that carry AFD evidence, else None.

    A key absent in every carrying step (e.g. the straggler with one FFN rank) stays an
    absent record with the steps' reason; steps where it is absent do not enter its mean.
    """
    carrying = [step for step in steps if all(key in step for key in AFD_OVERLAP_KEYS)]
    if not carrying:
        return None
    summary: dict[str, Any] = {}
    for key in AFD_OVERLAP_KEYS:
        values = [float(step[key]) for step in carrying if _measured(step[key])]
        if values:
            summary[key] = float(np.mean(values))
        else:
            reasons = sorted({step[key]["absent_reason"] for step in carrying
                              if is_absent(step[key])})
            summary[key] = absent("; ".join(reasons) or f"no step measured {key}")
    return summary


def correlation_evidence(points: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Imbalance vs relative run time (and AFD overlap/straggler time when measured).

    Each point: ``workload``, ``policy``, ``imbalance`` (max over steps),
    ``relative_run_time`` (run time / the workload's unsplit run time) and
    optionally the :data:`AFD_OVERLAP_KEYS`. Only split cases carry an imbalance.
    """
    split = [p for p in points if p["imbalance"] is not None]
    imbalance = [float(p["imbalance"]) for p in split]
    evidence: dict[str, Any] = {
        "points": [dict(p) for p in points],
        "imbalance_vs_relative_run_time_r": pearson(
            imbalance, [float(p["relative_run_time"]) for p in split]
        ),
    }
    for key in AFD_OVERLAP_KEYS:
        # Only points that measured the key: an absent straggler is not a straggler of 0.
        with_key = [p for p in split if _measured(p.get(key))]
        evidence[f"imbalance_vs_{key}_r"] = (
            pearson([float(p["imbalance"]) for p in with_key], [float(p[key]) for p in with_key])
            if with_key
            else None
        )
    return evidence
