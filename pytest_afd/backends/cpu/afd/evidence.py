"""Timelines recorded by the AFD ranks and the per-step evidence derived from them.

Each rank records spans ``(kind, layer, ubatch, start, end)`` with
``time.perf_counter`` (CLOCK_MONOTONIC on Linux, so spans from different
processes share one time axis). The parent turns the spans of all ranks into
the step's evidence: per-layer/per-ubatch times, exposed bubble, critical path,
stage overlap and load statistics. Definitions: docs/afd-runtime.md.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from afd_split.ranges import emit_range
from pytest_afd.profiling import overlap

# Attention-side span kinds.
EMBED = "embed"
ATTENTION = "attention"
ROUTE = "route"
DENSE_MLP = "dense_mlp"
DISPATCH = "dispatch"  # pack the a2e payload and post the sends
WAIT = "wait"  # blocked on the e2a result of a ubatch: the exposed bubble
COMBINE = "combine"  # add the expert output back into the residual stream
FINAL = "final"
# FFN-side span kinds.
FFN_IDLE = "ffn_idle"  # waiting for the next a2e message
RECV = "recv"  # receiving an a2e payload after its header arrived
ROUTED_MOE = "routed_moe"
SHARED_MOE = "shared_moe"
SEND = "send"  # posting the e2a result

ATTENTION_BUSY_KINDS = frozenset({EMBED, ATTENTION, ROUTE, DENSE_MLP, DISPATCH, COMBINE, FINAL})
FFN_BUSY_KINDS = frozenset({RECV, ROUTED_MOE, SHARED_MOE, SEND})
WAIT_KINDS = frozenset({WAIT, FFN_IDLE})
NO_LAYER = -1
NO_UBATCH = -1
NO_PEER = -1

SPAN_FIELDS = ("kind", "layer", "ubatch", "start", "end", "peer", "cpu")
"""``cpu``: the recording thread's CPU seconds inside the span (``time.thread_time``).

With one intra-op thread the torch work of a span runs on that thread, so
``cpu`` is what the work cost and ``end - start - cpu`` is time the OS gave to
other processes: the measure that separates interference from the split."""
# A message's receiver waits (WAIT_KIND) for the sender's span (SENDER_KIND).
SENDER_KIND = {WAIT: SEND, FFN_IDLE: DISPATCH}


@dataclass
class Timeline:
    """Spans of one rank for one step; disabled timelines record nothing (headline runs)."""

    enabled: bool
    spans: list[tuple[str, int, int, float, float, int]] = field(default_factory=list)

    @contextlib.contextmanager
    def span(
        self, kind: str, layer: int = NO_LAYER, ubatch: int = NO_UBATCH, peer: int = NO_PEER
    ) -> Iterator[None]:
        """Time the body; ``peer`` is the global rank a message span talks to."""
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        cpu_start = time.thread_time()
        try:
            # The same stage, as a profiler range nested inside this span (afd_split.ranges).
            with emit_range(kind, layer, ubatch):
                yield
        finally:
            cpu = time.thread_time() - cpu_start
            self.spans.append((kind, layer, ubatch, start, time.perf_counter(), peer, cpu))

    def add(
        self, kind: str, layer: int, ubatch: int, start: float, end: float, peer: int = NO_PEER
    ) -> None:
        """Record a span whose labels are known only after it ended (an idle wait)."""
        if self.enabled:
            self.spans.append((kind, layer, ubatch, start, end, peer, 0.0))


@dataclass(frozen=True)
class Span:
    rank: int
    kind: str
    layer: int
    ubatch: int
    start: float
    end: float
    peer: int = NO_PEER
    cpu: float = 0.0

    @property
    def duration(self) -> float:
        return self.end - self.start


def as_spans(global_rank: int, raw: Iterable[Sequence]) -> list[Span]:
    return [Span(global_rank, *record) for record in raw]


def overlap_fraction(attention: Sequence[Span], ffn: Sequence[Span]) -> float:
    """Share of the smaller side's busy time during which the other side was busy too.

    1.0: the lighter role ran entirely in the shadow of the heavier one; 0.0:
    the roles strictly alternated (the unsplit case).
    """
    attention_busy = [(s.start, s.end) for s in attention if s.kind in ATTENTION_BUSY_KINDS]
    ffn_busy = [(s.start, s.end) for s in ffn if s.kind in FFN_BUSY_KINDS]
    fraction = overlap.overlap_fraction(attention_busy, ffn_busy)  # the profiles' definition
    return 0.0 if fraction is None else fraction


def critical_path(spans_by_rank: dict[int, list[Span]]) -> dict:
    """Walk back from the step's last span along the dependency that finished last.

    On one rank the predecessor of a span is the previous span; a wait span
    means the rank was blocked on a message, so the path jumps to the peer's
    span that sent it (same layer, ubatch and peer pair). Waits are not on the
    path; their time is the bubble. Returns the path's busy time by kind and rank.
    """
    position = {
        (span.rank, span.kind, span.layer, span.ubatch, span.peer): (rank, index)
        for rank, spans in spans_by_rank.items()
        for index, span in enumerate(spans)
    }
    rank = max(spans_by_rank, key=lambda r: spans_by_rank[r][-1].end if spans_by_rank[r] else 0)
    index = len(spans_by_rank[rank]) - 1
    by_kind: dict[str, float] = defaultdict(float)
    by_rank: dict[int, float] = defaultdict(float)
    switches = 0
    budget = sum(len(spans) for spans in spans_by_rank.values())
    while index >= 0 and budget > 0:
        budget -= 1
        span = spans_by_rank[rank][index]
        if span.kind in WAIT_KINDS:
            key = (span.peer, SENDER_KIND[span.kind], span.layer, span.ubatch, span.rank)
            sender = position.get(key)
            if sender is not None and spans_by_rank[sender[0]][sender[1]].end > span.start:
                rank, index = sender
                switches += 1
                continue
        else:
            by_kind[span.kind] += span.duration
            by_rank[rank] += span.duration
        index -= 1
    return {
        "critical_path_s": sum(by_kind.values()),
        "critical_path_by_kind_s": dict(sorted(by_kind.items())),
        "critical_path_by_rank_s": {str(r): v for r, v in sorted(by_rank.items())},
        "critical_path_rank_switches": switches,
    }


def load_stats(counts: Sequence[float]) -> dict:
    """max/mean and coefficient of variation of a load vector (0-safe)."""
    values = np.asarray(counts, dtype=np.float64)
    mean = float(values.mean()) if values.size else 0.0
    if mean <= 0:
        return {
            "max": float(values.max(initial=0.0)),
            "mean": mean,
            "max_over_mean": None,
            "cv": None,
        }
    return {
        "max": float(values.max()),
        "mean": mean,
        "max_over_mean": float(values.max() / mean),
        "cv": float(values.std() / mean),
    }


def per_layer_table(spans: Iterable[Span], *, cpu: bool = False) -> list[dict]:
    """Wall (or, with ``cpu``, thread-CPU) seconds per (layer, ubatch, kind), summed over ranks."""
    table: dict[tuple[int, int], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for span in spans:
        if span.layer == NO_LAYER:
            continue
        table[(span.layer, span.ubatch)][span.kind] += span.cpu if cpu else span.duration
    return [
        {"layer": layer, "ubatch": ubatch, **{k: round(v, 9) for k, v in sorted(kinds.items())}}
        for (layer, ubatch), kinds in sorted(table.items())
    ]


def totals_by_kind(spans: Iterable[Span], *, cpu: bool = False) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for span in spans:
        totals[span.kind] += span.cpu if cpu else span.duration
    return dict(sorted(totals.items()))
