"""Run cases round by round until every comparison is decided (``--afd-repeats sequential``).

The measuring counterpart of :mod:`pytest_afd.stats.sequential`. Warmups first (as
:func:`pytest_afd.stats.repetitions.run_repeated`), then rounds: each round measures one
repetition of every *active* case (in a comparison still open, or below the
first look), interleaved or in a seeded random order within the round. Both
cases of a comparison are active until it stops, so their ``i``-th repetitions
were measured in the same round and are paired. At each planned look every open
comparison is decided (:meth:`SequentialDesign.decide`); a case leaves the
schedule when all its comparisons have stopped.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_afd.stats.repetitions import RUN_ORDERS, RepeatedRun, _as_metrics
from pytest_afd.stats.sequential import Decision, SequentialDesign, paired_log_ratios

SEQUENTIAL_METRIC = "wall_time_s"
"""The metric a comparison decides on: each run's wall time (lower is faster)."""


@dataclass
class SequentialRun(RepeatedRun):
    """A :class:`RepeatedRun` whose cases may hold different repetition counts, with the
    design and each comparison's decision."""

    design: SequentialDesign = field(default_factory=SequentialDesign)
    comparisons: list[tuple[str, str]] = field(default_factory=list)
    decisions: dict[tuple[str, str], Decision] = field(default_factory=dict)
    metric: str = SEQUENTIAL_METRIC

    def comparison_json(self, pair: tuple[str, str]) -> dict:
        return {"a": pair[0], "b": pair[1], "metric": self.metric,
                **self.decisions[pair].to_json()}

    def protocol_json(self, case: str | None = None) -> dict:
        """The schema's ``protocol`` object; ``repetitions`` is ``case``'s own count (the
        most any case used without ``case``), ``sequential`` the comparisons it is in."""
        counts = {name: len(next(iter(metrics.values()), []))
                  for name, metrics in self.values.items()}
        pairs = [pair for pair in self.comparisons if case is None or case in pair]
        return {**super().protocol_json(),
                "repetitions": counts[case] if case is not None else max(counts.values()),
                "sequential": {**self.design.to_json(), "metric": self.metric,
                               "comparisons": [self.comparison_json(p) for p in pairs]}}


def check_comparisons(names: Sequence[str], comparisons: Sequence[tuple[str, str]]) -> None:
    known = set(names)
    for a, b in comparisons:
        if a not in known or b not in known or a == b:
            raise ValueError(f"comparison {(a, b)!r} must name two different cases of {list(names)}")


def run_sequential(
    cases: Mapping[str, Callable[[], float | Mapping[str, float]]],
    comparisons: Sequence[tuple[str, str]],
    *,
    design: SequentialDesign,
    warmups: int = 1,
    run_order: str = "interleaved",
    seed: int = 0,
    metric: str = SEQUENTIAL_METRIC,
) -> SequentialRun:
    """Measure until every comparison stopped; a case in no comparison gets the first
    look's repetitions (the RFC's minimum)."""
    if run_order not in RUN_ORDERS:
        raise ValueError(f"run_order={run_order!r}; expected one of {RUN_ORDERS}")
    if warmups < 0:
        raise ValueError(f"warmups={warmups}; expected >= 0")
    if not cases:
        raise ValueError("run_sequential() needs at least one case")
    names = list(cases)
    check_comparisons(names, comparisons)
    shuffle = random.Random(seed)
    for name in names:
        for _ in range(warmups):
            cases[name]()
    result = SequentialRun(repetitions=design.min_repetitions, warmups=warmups,
                           run_order=run_order, seed=seed, executed_order=[],
                           values={name: {} for name in names}, design=design,
                           comparisons=list(comparisons), metric=metric)
    open_pairs = list(dict.fromkeys(comparisons))
    rounds = 0
    while True:
        active = [name for name in names
                  if rounds < design.min_repetitions or any(name in p for p in open_pairs)]
        if not active:
            break
        # Within a round, "fixed" and "interleaved" both keep the case order.
        order = shuffle.sample(active, len(active)) if run_order == "random" else list(active)
        for name in order:
            for key, value in _as_metrics(cases[name](), name).items():
                result.values[name].setdefault(key, []).append(value)
            result.executed_order.append(f"{name}#{rounds}")
        rounds += 1
        for pair in list(open_pairs):
            a_values = result.values[pair[0]].get(metric)
            b_values = result.values[pair[1]].get(metric)
            if a_values is None or b_values is None:
                raise ValueError(f"comparison {pair!r}: a case returned no {metric!r} metric")
            decision = design.decide(paired_log_ratios(a_values, b_values))
            if decision is not None:
                result.decisions[pair] = decision
                open_pairs.remove(pair)
    return result


def default_comparisons(cases: Sequence[Any], ab_sides: Sequence[str] | None = None
                        ) -> list[tuple[str, str]]:
    """The comparisons of one ``measure`` call when the stage names none.

    A/B runs: each case's side A against its side B. Otherwise every case against
    the first case of the call on the same workload (spec) and cache phase (its
    reference: a stage lists its reference policy first, or passes its own).
    """
    if ab_sides is not None:
        first, second = ab_sides
        return [(c.name, c.name.removesuffix(f"/{first}") + f"/{second}")
                for c in cases if c.name.endswith(f"/{first}")]
    reference: dict[tuple[str, str], str] = {}
    pairs = []
    for case in cases:
        # The workload's whole spec (two hit ratios of one distribution are two workloads).
        key = (repr(case.workload.spec), case.phase)
        if key in reference:
            pairs.append((reference[key], case.name))
        else:
            reference[key] = case.name
    return pairs
