"""Join a case's step lines to its prompts by request id, not by the server's numbering.

A server numbers the requests of a step in its own batch, in arrival order; a
client's burst arrives in any order, and may be cut into several server
batches. So a step line's ``schedule.requests`` index the server's batch, and
read against the case's prompts they point at the wrong requests (a final
chunk charged to another prompt, a boundary request of the wrong length). The
step lines carry the engine's request ids (``request_ids``, in batch order):
each id names the client's request id (``X-Request-Id``) inside the engine's
own decoration (vLLM's ``cmpl-<id>-<n>``, the harness server's ``<id>#<nonce>``),
so the join finds the case's prompt by that id and rewrites the indices.

A line with a schedule but no ids, or an id that names no prompt of the case
(or several), is a problem named by step; the case's step evidence is then
absent with that reason, never joined by position.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from afd_split.hook.planning.engine_step import REQUEST_IDS_FIELD

SCHEDULE_FIELD = "schedule"
SCHEDULE_REQUESTS = "requests"
SERVER_REQUESTS = "server_requests"
"""The server's own batch indices, kept beside the case's after the join."""

_ID_CHAR = r"[A-Za-z0-9_]"


def id_pattern(client_id: str) -> re.Pattern[str]:
    """``client_id`` as a whole token of an engine id (``req-1`` is not in ``cmpl-req-10-0``)."""
    return re.compile(rf"(?<!{_ID_CHAR}){re.escape(client_id)}(?!{_ID_CHAR})")


def prompt_index(engine_id: str, patterns: Sequence[tuple[int, str, re.Pattern[str]]]) -> int | None:
    """The one prompt whose id ``engine_id`` names (the longest id when one contains another)."""
    found = [(len(client_id), index) for index, client_id, pattern in patterns
             if pattern.search(engine_id)]
    if not found:
        return None
    longest = max(length for length, _ in found)
    indices = [index for length, index in found if length == longest]
    return indices[0] if len(indices) == 1 else None


def join_requests(records: Sequence[dict[str, Any]], request_ids: Sequence[str],
                  problems: list[str]) -> None:
    """Rewrite each record's ``schedule.requests`` to positions in ``request_ids`` (the
    case's prompts); problems are appended by step (the records are then unusable)."""
    patterns = [(index, client_id, id_pattern(client_id))
                for index, client_id in enumerate(request_ids)]
    for record in records:
        schedule = record.get(SCHEDULE_FIELD)
        if not isinstance(schedule, Mapping) or SCHEDULE_REQUESTS not in schedule:
            continue  # no per-request indices to join (the plan's counts stand alone)
        where = f"step {record.get('step')} of rank {record.get('ranks', {}).get('global_rank')}"
        engine_ids = record.get(REQUEST_IDS_FIELD)
        if not isinstance(engine_ids, list) or len(engine_ids) != len(schedule[SCHEDULE_REQUESTS]):
            problems.append(f"{where}: its schedule has no matching {REQUEST_IDS_FIELD!r} "
                            "(the server's request numbering cannot be joined to the case)")
            continue
        joined = [prompt_index(str(engine_id), patterns) for engine_id in engine_ids]
        unknown = [engine_id for engine_id, index in zip(engine_ids, joined, strict=True)
                   if index is None]
        if unknown:
            problems.append(f"{where}: request ids {unknown} name no single request of this "
                            f"case (its ids: {list(request_ids)[:8]}...)")
            continue
        record[SCHEDULE_FIELD] = {**schedule, SCHEDULE_REQUESTS: joined,
                                  SERVER_REQUESTS: list(schedule[SCHEDULE_REQUESTS])}
