"""Chunk-size sweeps: each candidate valid or omitted with its reason, joint effects flagged.

Growing a chunk can remove tail forwards yet add a communication round
(chunk-semantics §4); a sweep reports both effects on the same candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_afd.scheduling.model import SchedulePlan, SchedulerConfig, schedule


@dataclass(frozen=True)
class SweepCandidate:
    """One chunk size of a sweep, compared with the previous valid candidate."""

    plan: SchedulePlan
    # The previous valid candidate's plan (None for the first valid one).
    previous: SchedulePlan | None
    # Its forwards need a different max number of comm rounds than the previous
    # candidate's (or, for the first, more than one round somewhere).
    crosses_round_boundary: bool

    @property
    def chunk_size(self) -> int | None:
        return self.plan.config.chunk_size

    @property
    def label(self) -> str:
        return self.plan.config.describe_chunk()

    @property
    def is_joint(self) -> bool:
        """Crosses a round boundary while also changing the forwards: report both together."""
        return self.crosses_round_boundary and (
            self.previous is None
            or self.previous.num_batches != self.plan.num_batches
            or self.previous.num_tail_batches != self.plan.num_tail_batches
        )

    def effects(self) -> dict[str, Any] | None:
        """Batch and round changes against the previous valid candidate."""
        if not self.plan.valid:
            return None
        # Without a previous candidate, compare the plan with itself (all deltas 0).
        before = self.plan if self.previous is None else self.previous
        after = self.plan
        return {
            "compared_to": None if self.previous is None else before.config.describe_chunk(),
            "num_batches": _change(before.num_batches, after.num_batches),
            "tail_batches": _change(before.num_tail_batches, after.num_tail_batches),
            "max_comm_rounds": _change(before.max_comm_rounds, after.max_comm_rounds),
            "total_comm_rounds": _change(before.total_comm_rounds, after.total_comm_rounds),
            "max_rows_per_rank": _change(before.max_rows_per_rank, after.max_rows_per_rank),
            "padding_rows_per_rank": _change(
                before.padding_rows_per_rank, after.padding_rows_per_rank
            ),
        }

    def note(self) -> str:
        """One line for the human table."""
        if not self.plan.valid:
            return "omitted: " + "; ".join(self.plan.reasons)
        if not self.crosses_round_boundary:
            return ""
        capacity = self.plan.config.round_capacity
        rows = self.plan.max_rows_per_rank
        rounds = f"max comm rounds {self.plan.max_comm_rounds}"
        if self.previous is None:
            return f"crosses a comm-round boundary: {rounds} (rows/rank {rows} > {capacity})"
        before = self.previous
        return (
            f"{'JOINT candidate' if self.is_joint else 'crosses a comm-round boundary'} vs "
            f"{before.config.describe_chunk()}: forwards {before.num_batches}->"
            f"{self.plan.num_batches}, tail batches {before.num_tail_batches}->"
            f"{self.plan.num_tail_batches}, max comm rounds {before.max_comm_rounds}->"
            f"{self.plan.max_comm_rounds} (rows/rank {rows}, capacity {capacity})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "chunk": self.label,
            "plan": self.plan.to_json(),
            "crosses_round_boundary": self.crosses_round_boundary,
            "joint_candidate": self.is_joint,
            "effects": self.effects(),
            "note": self.note(),
        }


def _change(before: int, after: int) -> dict[str, int]:
    return {"before": before, "after": after, "delta": after - before}


def sweep(
    prompt_lengths: Sequence[int],
    chunk_sizes: Sequence[int | None],
    *,
    base_config: SchedulerConfig,
    cached_tokens: Sequence[int] | None = None,
) -> list[SweepCandidate]:
    """Plan every chunk size (None = unchunked) in the given order on the same queue."""
    candidates = []
    previous: SchedulePlan | None = None
    for chunk_size in chunk_sizes:
        plan = schedule(
            prompt_lengths,
            config=replace(base_config, chunk_size=chunk_size),
            cached_tokens=cached_tokens,
        )
        if not plan.valid:
            candidates.append(SweepCandidate(plan, previous, crosses_round_boundary=False))
            continue
        if previous is None:
            crosses = plan.max_comm_rounds > 1
        else:
            crosses = plan.max_comm_rounds != previous.max_comm_rounds
        candidates.append(SweepCandidate(plan, previous, crosses_round_boundary=crosses))
        previous = plan
    return candidates
