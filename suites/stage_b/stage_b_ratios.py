"""Stage B: which requested hit ratios a workload can realise (the top one may step down)."""

from __future__ import annotations

# Step down from an unrealizable top ratio by this much until the workload builds.
FALLBACK_STEP = 0.05
PERCENT = 100


def ratio_label(ratio: float) -> str:
    return f"hit{round(ratio * PERCENT)}"


def realizable_ratios(build, ratios):
    """(workloads by requested ratio, notes): the top ratio steps down until it is realizable."""
    workloads, notes = {}, {}
    for ratio in ratios:
        candidate = ratio
        while True:
            try:
                workloads[candidate] = build(candidate)
                break
            except ValueError as exc:
                lower = round(candidate - FALLBACK_STEP, 2)
                if ratio != max(ratios) or lower <= max(
                    (r for r in ratios if r < ratio), default=0.0
                ):
                    raise
                notes[lower] = (
                    f"requested {ratio:.0%} is not realizable ({exc}); highest stable: {lower:.0%}"
                )
                candidate = lower
    return workloads, notes
