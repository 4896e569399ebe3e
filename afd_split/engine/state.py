"""Snapshot and restore of mutable runtime state around a split forward.

The split path swaps per-stage attributes into the forward context and the
PCP / SP helpers; a failure halfway must not leak one stage's metadata into
the next step. Bindings are restored (object identity kept); attributes that
did not exist before are deleted again. Buffers the caller does not own but a
build writes through (an engine builder's persistent slot buffer) are named as
``BufferContents`` targets: their contents are copied back in place, so every
view of them, the parent batch's included, reads what it read before.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

_ABSENT = object()
"""Marks an attribute that did not exist when the snapshot was taken."""


@dataclass(frozen=True, eq=False)
class BufferContents:
    """A ``preserved_state`` target: a tensor whose contents (not binding) are restored.

    Any object with ``clone()`` and ``copy_(other)`` (a torch tensor) works; the
    snapshot is one clone, the restore one in-place copy, so views stay views.
    ``limit``: only the first ``limit`` entries (along the first dimension) are kept
    and restored, the prefix the guarded build can write; upstream sizes these
    buffers from the deployment, so copying all of them costs a one-request step
    as much as a full one (issue 43). None: the whole buffer.
    """

    buffer: Any
    limit: int | None = None

    def region(self) -> Any:
        """The part of the buffer that is snapshot and restored (a view)."""
        return self.buffer if self.limit is None else self.buffer[:self.limit]


@dataclass(frozen=True, eq=False)
class AllBindings:
    """A ``preserved_state`` target: every instance attribute of ``owner`` (``vars``),
    restored as a whole; attributes added inside the block are deleted again."""

    owner: Any


_CONTENTS = "<contents>"
"""The ``name`` slot of a ``BufferContents`` snapshot entry."""
_ALL = "<all bindings>"
"""The ``name`` slot of an ``AllBindings`` snapshot entry."""


def _snapshot(targets) -> list[tuple[object, str, object]]:
    """(object, name, value-or-_ABSENT) for every named attribute of every target, and
    (buffer, _CONTENTS, copy) for every ``BufferContents`` target."""
    saved = []
    for target in targets:
        if isinstance(target, BufferContents):
            region = target.region()
            saved.append((region, _CONTENTS, region.clone()))
            continue
        if isinstance(target, AllBindings):
            saved.append((target.owner, _ALL, dict(vars(target.owner))))
            continue
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
def preserved_state(*targets: tuple[object, Iterable[str] | str] | BufferContents | AllBindings,
                    ) -> Iterator[None]:
    """Restore the named attributes of each ``(object, names)`` target, every attribute of
    each ``AllBindings`` target, and the contents of each ``BufferContents`` target, on exit.

    Runs on success and on exception (the exception propagates). Restores in
    reverse order so a name listed twice ends at its first snapshot.
    """
    saved = _snapshot(targets)
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            if name is _CONTENTS:
                obj.copy_(value)
            elif name is _ALL:
                vars(obj).clear()
                vars(obj).update(value)
            elif value is _ABSENT:
                if hasattr(obj, name):
                    delattr(obj, name)
            else:
                setattr(obj, name, value)
