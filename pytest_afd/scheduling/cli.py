"""``afd-chunk-plan``: what a chunk size does to batch shapes, before an expensive restart.

Exit codes: 0 a valid plan (a sweep with at least one valid size), 1 the plan
is invalid (reasons printed), 2 nonsense input (argparse-style message).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import cycle, islice
from typing import Any

from pytest_afd.scheduling.arguments import (  # noqa: F401  (re-exported: the CLI's API)
    MAX_FORWARDS,
    MAX_NUM_REQUESTS,
    MAX_PROMPT_LEN,
    PROG,
    UNCHUNKED,
    build_parser,
    chunk_list,
    chunk_value,
    nonnegative_int,
    positive_int,
)
from pytest_afd.scheduling.model import (
    JSON_FIRST_FORWARDS,
    SchedulePlan,
    SchedulerConfig,
    schedule,
)
from pytest_afd.scheduling.prefix_cache import realized_cached_tokens
from pytest_afd.scheduling.sweep import SweepCandidate, sweep
from pytest_afd.scheduling.workload import (  # noqa: F401  (re-exported: the CLI's API)
    MAX_WORKLOAD_BYTES,
    QueueEntry,
    load_workload,
)

EXIT_OK = 0
EXIT_INVALID_PLAN = 1


# ---------------------------------------------------------------------------
# Queue bounds


def _check_size(
    entries: Sequence[QueueEntry], chunks: Sequence[int | None], max_batched: int
) -> None:
    """Refuse a queue whose plan would take minutes: too many requests or forwards."""
    if len(entries) > MAX_NUM_REQUESTS:
        raise ValueError(f"{len(entries)} requests is more than the limit {MAX_NUM_REQUESTS}")
    total = sum(entry.prompt_len for entry in entries)
    for chunk in chunks:
        per_forward = max_batched if chunk is None else min(chunk, max_batched)
        forwards = -(-total // per_forward)
        if forwards > MAX_FORWARDS:
            label = UNCHUNKED if chunk is None else f"chunk {chunk}"
            raise ValueError(
                f"{total} prompt tokens at {per_forward} tokens per forward ({label}, "
                f"--max-batched-tokens {max_batched}) need at least {forwards} forwards; "
                f"the limit is {MAX_FORWARDS}"
            )


# ---------------------------------------------------------------------------
# From arguments to a queue and a config


@dataclass(frozen=True)
class PlanInputs:
    prompt_lengths: tuple[int, ...]
    requested_cached: tuple[int, ...]
    cached_tokens: tuple[int, ...]
    config: SchedulerConfig  # chunk_size from --chunk (or the first --sweep entry)


def _queue(args: argparse.Namespace) -> list[QueueEntry]:
    if args.workload is not None:
        entries = load_workload(args.workload)
    else:
        entries = [QueueEntry(length) for length in args.prompt_len]
    if args.num_requests is not None:
        entries = list(islice(cycle(entries), args.num_requests))
    return entries


def _dp_size(args: argparse.Namespace) -> int:
    if args.ranks is None:
        return 1 if args.dp is None else args.dp
    if args.ranks % args.cp:
        raise ValueError(f"cp {args.cp} does not divide the {args.ranks} ranks")
    folded = args.ranks // args.cp
    if args.dp is not None and args.dp != folded:
        raise ValueError(f"dp {args.dp} * cp {args.cp} != {args.ranks} ranks")
    return folded


def _cached(
    entries: Sequence[QueueEntry], flag: int | None, page: int
) -> tuple[list[int], list[int]]:
    requested, realized = [], []
    for index, entry in enumerate(entries):
        want = entry.requested_cached if entry.requested_cached is not None else (flag or 0)
        if want > entry.prompt_len:
            raise ValueError(
                f"cached prefix {want} is longer than request {index}'s prompt "
                f"({entry.prompt_len} tokens)"
            )
        requested.append(want)
        realized.append(realized_cached_tokens(entry.prompt_len, want, page))
    return requested, realized


def prepare(args: argparse.Namespace) -> PlanInputs:
    """Validate the arguments together; raises ValueError naming the bad value."""
    entries = _queue(args)
    _check_size(
        entries, [args.chunk] if args.sweep is None else args.sweep, args.max_batched_tokens
    )
    chunk = args.chunk if args.sweep is None else args.sweep[0]
    config = SchedulerConfig(
        chunk_size=chunk,
        dp_size=_dp_size(args),
        cp_size=args.cp,
        page_size=args.page_size,
        max_prefill_reqs=args.max_prefill_reqs,
        max_batched_tokens=args.max_batched_tokens,
        round_capacity=args.round_capacity,
        max_running_seqs=args.max_running_seqs,
    )
    requested, realized = _cached(entries, args.cached_prefix, args.page_size)
    return PlanInputs(
        prompt_lengths=tuple(entry.prompt_len for entry in entries),
        requested_cached=tuple(requested),
        cached_tokens=tuple(realized),
        config=config,
    )


# ---------------------------------------------------------------------------
# Output


def _queue_json(inputs: PlanInputs) -> dict[str, Any]:
    return {
        "num_requests": len(inputs.prompt_lengths),
        "total_prompt_tokens": sum(inputs.prompt_lengths),
        "requested_cached_tokens": sum(inputs.requested_cached),
        "realized_cached_tokens": sum(inputs.cached_tokens),
        # Per request (first few): a hit counts whole blocks, so realized <= requested.
        "requested_cached_first": list(inputs.requested_cached[:JSON_FIRST_FORWARDS]),
        "realized_cached_first": list(inputs.cached_tokens[:JSON_FIRST_FORWARDS]),
    }


def _config_line(config: SchedulerConfig) -> str:
    slots = f"{config.max_prefill_reqs}"
    if config.max_running_seqs is not None:
        slots += f" (running cap {config.max_running_seqs})"
    return (
        f"dp {config.dp_size} | cp {config.cp_size} | page {config.page_size} | slots {slots} | "
        f"max batched {config.max_batched_tokens} | round capacity {config.round_capacity}"
    )


def _queue_line(inputs: PlanInputs) -> str:
    return (
        f"queue: {len(inputs.prompt_lengths)} requests, {sum(inputs.prompt_lengths)} prompt "
        f"tokens, cached {sum(inputs.cached_tokens)} realized of "
        f"{sum(inputs.requested_cached)} requested"
    )


def _format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [list(header)] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    return [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]


def render_plan(plan: SchedulePlan, inputs: PlanInputs, show_forwards: int) -> str:
    config = plan.config
    lines = [
        f"chunk {config.describe_chunk()} -> "
        + (
            "unchunked (budget = max batched tokens)"
            if config.chunk_size is None
            else f"effective {plan.effective_chunk} after dp {config.dp_size}"
        ),
        _config_line(config),
        _queue_line(inputs),
    ]
    if not plan.valid:
        lines.append("INVALID:")
        lines += [f"  - {reason}" for reason in plan.reasons]
        return "\n".join(lines)
    forwards = plan.forwards_per_request
    lines += [
        f"valid: {plan.num_batches} forwards, {plan.total_scheduled_tokens} scheduled tokens, "
        f"{plan.num_tail_batches} tail batch(es)",
        "first request chunks: " + " + ".join(str(n) for n in plan.chunks_of(0)),
        f"forwards per request: max {max(forwards, default=0)}, "
        f"mean {sum(forwards) / max(len(forwards), 1):.2f}",
        f"rows/rank: max {plan.max_rows_per_rank} (zigzag padding {plan.padding_rows_per_rank}); "
        f"comm rounds: max {plan.max_comm_rounds}, total {plan.total_comm_rounds}",
    ]
    rows = [
        (
            index,
            batch.num_requests,
            batch.num_tokens,
            batch.charged_tokens,
            batch.rows_per_rank,
            batch.comm_rounds,
            "tail" if batch.is_tail_batch else "",
        )
        for index, batch in enumerate(plan.batches[:show_forwards])
    ]
    if rows:
        lines += _format_table(
            ("fwd", "reqs", "tokens", "charged", "rows/rank", "rounds", ""), rows
        )
    if plan.num_batches > show_forwards:
        lines.append(f"... {plan.num_batches - show_forwards} more forwards")
    return "\n".join(lines)


# What each column and note label of a sweep means (printed under the table).
SWEEP_KEY = {
    "effective": "the chunk the scheduler uses per DP replica (chunk // dp; - = unchunked)",
    "forwards": "forward steps that prefill the whole queue; max fwd/req: most forwards one "
                "request needs",
    "tails": "forwards holding only the final pieces of continued requests, under one page "
             "(almost empty steps)",
    "max rows/rank": "most prompt rows one CP rank holds in a forward",
    "max rounds": "most dispatch/combine rounds one forward needs (rows/rank over the round "
                  "capacity, rounded up); rounds: their total over all forwards",
}
SWEEP_LABELS = {
    "JOINT candidate": "against the previous valid size this one changes the forwards (or tail "
                       "batches) AND the comm rounds per forward: its time change mixes both "
                       "effects (chunk-semantics §4), so measure it, do not infer it from either",
    "crosses a comm-round boundary": "more (or fewer) rounds per forward than the previous "
                                     "valid size with the same forwards",
    "omitted": "the size is invalid for this configuration; the reason follows",
}


def render_sweep(candidates: Sequence[SweepCandidate], inputs: PlanInputs) -> str:
    lines = [_config_line(inputs.config), _queue_line(inputs)]
    rows = []
    for candidate in candidates:
        plan = candidate.plan
        if plan.valid:
            rows.append(
                (
                    candidate.label,
                    "-" if plan.effective_chunk is None else plan.effective_chunk,
                    "yes",
                    plan.num_batches,
                    max(plan.forwards_per_request, default=0),
                    plan.num_tail_batches,
                    plan.max_rows_per_rank,
                    plan.max_comm_rounds,
                    plan.total_comm_rounds,
                )
            )
        else:
            rows.append(
                (
                    candidate.label,
                    "-" if plan.effective_chunk is None else plan.effective_chunk,
                    "no",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                )
            )
    lines += _format_table(
        (
            "chunk",
            "effective",
            "valid",
            "forwards",
            "max fwd/req",
            "tails",
            "max rows/rank",
            "max rounds",
            "rounds",
        ),
        rows,
    )
    notes = [f"{candidate.label}: {candidate.note()}" for candidate in candidates
             if candidate.note()]
    lines += notes
    lines += ["", "key:", *(f"  {name}: {meaning}" for name, meaning in SWEEP_KEY.items())]
    used = " ".join(notes)
    lines += [f"  {label}: {meaning}" for label, meaning in SWEEP_LABELS.items() if label in used]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        inputs = prepare(args)
    except (ValueError, TypeError) as error:
        parser.error(str(error))
    if args.sweep is not None:
        candidates = sweep(
            inputs.prompt_lengths,
            args.sweep,
            base_config=inputs.config,
            cached_tokens=inputs.cached_tokens,
        )
        if args.json:
            doc = {
                "queue": _queue_json(inputs),
                "candidates": [candidate.to_json() for candidate in candidates],
            }
            print(json.dumps(doc, indent=2))
        else:
            print(render_sweep(candidates, inputs))
        any_valid = any(candidate.plan.valid for candidate in candidates)
        return EXIT_OK if any_valid else EXIT_INVALID_PLAN
    plan = schedule(inputs.prompt_lengths, config=inputs.config, cached_tokens=inputs.cached_tokens)
    if args.json:
        print(json.dumps({**plan.to_json(), "queue": _queue_json(inputs)}, indent=2))
    else:
        print(render_plan(plan, inputs, args.show_forwards))
    return EXIT_OK if plan.valid else EXIT_INVALID_PLAN


if __name__ == "__main__":
    sys.exit(main())
