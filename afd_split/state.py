"""Snapshot and restore of mutable runtime state around a split forward.

The split path swaps per-stage attributes into the forward context and the
PCP / SP helpers; a failure halfway must not leak one stage's metadata into
the next step. Bindings are restored (object identity kept); attributes that
did not exist before are deleted again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

_ABSENT = object()
"""Marks an attribute that did not exist when the snapshot was taken."""


def _snapshot(targets) -> list[tuple[object, str, object]]:
    """(object, name, value-or-_ABSENT) for every named attribute of every target."""
    saved = []
    for target in targets:
        try:
            obj, names = target
        except (TypeError, ValueError):
            raise TypeError(
                f"preserved_state targets are (object, attribute names) pairs, got {target!r}"
            ) from None
        if isinstance(names, str):
            names = (names,)
        saved.extend((obj, name, getattr(obj, name, _ABSENT)) for name in names)
    return saved


@contextmanager
def preserved_state(*targets: tuple[object, Iterable[str] | str]) -> Iterator[None]:
    """Restore the named attributes of each ``(object, names)`` target on exit.

    Runs on success and on exception (the exception propagates). Restores in
    reverse order so a name listed twice ends at its first snapshot.
    """
    saved = _snapshot(targets)
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            if value is _ABSENT:
                if hasattr(obj, name):
                    delattr(obj, name)
            else:
                setattr(obj, name, value)
