"""Under pytest-xdist, the known-long cases first: the last case to end sets the wall time.

``--dist worksteal`` hands each worker a contiguous share of the collection order and
lets an idle worker take half of another's queue. A long case collected last (gate 5's
soak is the gates' longest, and its module sorts last) then runs alone at the end while
the other worker has nothing left to take: measured on 2 cores, the two workers of
``pytest -m gate -n 2`` ended 2 s apart with the soak last. Moving the known-long cases
to the front (longest processing time first, the classic makespan heuristic) leaves the
short ones to even out the end. Only the workers reorder (``session.is_worker``: they
collect the order the controller schedules, each the same), so a serial session keeps the
collection order (``fault-check`` orders its modules itself), and so does every case not
named.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def long_cases_first(items: Sequence[Any], long_names: Iterable[str]) -> list[Any]:
    """``items`` with those whose function (``originalname``) is in ``long_names`` first,
    in the order ``long_names`` gives, each group otherwise in collection order."""
    rank = {name: index for index, name in enumerate(long_names)}
    last = len(rank)
    return sorted(items, key=lambda item: rank.get(getattr(item, "originalname", ""), last))
