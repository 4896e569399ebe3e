"""The FFN straggler: how much longer the slowest FFN rank's routed experts ran than the mean.

Per step, from each FFN rank's routed-expert kernels (``components.ROUTED_MOE``:
GroupedMatmul, the MoE routing/finalize kernels, ...) between the step trace's step
boundaries (``kernel_details.csv``'s ``Step Id``, the ids of ``step_trace_time.csv``):
``straggler_s`` = max - mean over the FFN ranks of their expert time in that step.
This needs no AFD layer range: on the FFN role the plugin emits none (the routed
experts run outside modules, docs/profiling.md), which made the old per-layer-only
figure read 0 on hardware. Where the ranges exist, ``per_layer`` splits the same
time by MoE layer.

Unknown is an absent record with its reason, never 0: no FFN profile, a single FFN
rank (nobody to straggle against), or no routed-expert kernel on any FFN rank in
the step. A rank that ran no expert kernel while another did contributes 0: the
export lists every kernel, so that 0 is what the input says.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from pytest_afd.core.absent import absent
from pytest_afd.profiling.components import ROUTED_MOE
from pytest_afd.profiling.timebase import seconds

if TYPE_CHECKING:
    from pytest_afd.profiling.evidence import RoleData

NO_FFN = "no FFN-side profile"
ONE_RANK = "one FFN rank: no other rank to straggle against"
MIN_RANKS = 2  # a straggler needs another rank to be slower than


def _spread(per_rank: dict[int, int]) -> tuple[Fraction, int]:
    """(max - mean) in ns, exactly, and the slowest rank (lowest id among ties)."""
    slowest = max(sorted(per_rank), key=per_rank.__getitem__)
    mean = Fraction(sum(per_rank.values()), len(per_rank))
    return per_rank[slowest] - mean, slowest


def expert_ns(ffn: RoleData, step: str) -> dict[int, int]:
    """Each FFN rank's routed-expert kernel time in ``step`` (ns; 0 for a rank that ran none)."""
    return {rank.rank: sum(i.duration_ns for i in rank.items
                           if i.step == step and i.component == ROUTED_MOE)
            for rank in ffn.ranks}


def step_straggler(ffn: RoleData | None, step: str) -> dict[str, Any]:
    """``{"straggler_s", "slowest_rank", "per_rank_s"}`` of one step, or an absent record."""
    if ffn is None:
        return absent(NO_FFN)
    if len(ffn.ranks) < MIN_RANKS:
        return absent(ONE_RANK)
    per_rank = expert_ns(ffn, step)
    if not any(per_rank.values()):
        return absent(f"no routed-expert kernel (e.g. GroupedMatmul) on any FFN rank in "
                      f"step {step!r}")
    spread, slowest = _spread(per_rank)
    return {"straggler_s": seconds(spread), "slowest_rank": slowest,
            "per_rank_s": {str(rank): seconds(ns) for rank, ns in sorted(per_rank.items())}}


def per_layer(ffn: RoleData) -> list[dict[str, Any]] | dict[str, Any]:
    """Per MoE layer (where kernels sit in ``afd|…|L<i>`` ranges): per-step seconds, max - mean."""
    num_steps = max(1, len(ffn.steps()))
    by_layer: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for rank in ffn.ranks:
        for item in rank.items:
            if item.component == ROUTED_MOE and item.tag is not None and item.tag.layer >= 0:
                by_layer[item.tag.layer][rank.rank] += item.duration_ns
    if not by_layer:
        return absent("the FFN role's expert kernels lie in no AFD layer range (the plugin "
                      "emits none there); per-step figures come from step boundaries")
    layers = []
    for layer in sorted(by_layer):
        per_rank = {rank.rank: by_layer[layer].get(rank.rank, 0) for rank in ffn.ranks}
        spread, slowest = _spread(per_rank)
        layers.append({"layer": layer,
                       "per_rank_s": [seconds(Fraction(ns, num_steps)) for ns in
                                      (per_rank[r.rank] for r in ffn.ranks)],
                       "straggler_s": seconds(spread / num_steps), "slowest_rank": slowest})
    return layers


def summary(ffn: RoleData | None,
            expert_load_per_rank: Sequence[Sequence[int]] | None) -> dict[str, Any]:
    """Per step and overall (mean per step): the straggler and its slowest rank."""
    if ffn is None:
        return absent(NO_FFN)
    steps = []
    spreads: list[Fraction] = []
    totals: dict[int, int] = defaultdict(int)
    for step in ffn.steps():
        figure = step_straggler(ffn, step)
        steps.append({"step": step, **figure})
        if "straggler_s" in figure:
            per_rank = expert_ns(ffn, step)
            spreads.append(_spread(per_rank)[0])
            for rank, ns in per_rank.items():
                totals[rank] += ns
    load = ([list(map(int, row)) for row in expert_load_per_rank] if expert_load_per_rank
            else absent("the run reported no per-rank expert load for these steps"))
    record: dict[str, Any] = {"per_step": steps, "per_layer": per_layer(ffn) if len(
        ffn.ranks) >= MIN_RANKS else absent(ONE_RANK), "expert_load_per_rank": load}
    if spreads:
        record["total_s"] = seconds(sum(spreads) / len(spreads))
        record["slowest_rank"] = _spread(dict(totals))[1]
    else:
        reason = steps[0]["absent_reason"] if steps else "no step in the FFN profile"
        record["total_s"] = absent(reason)
        record["slowest_rank"] = absent(reason)
    return record
