"""Pinned metadata layouts and the per-field split rules shared by the engine adapters.

API: ``load_layout(name) -> PinnedLayout``; ``match_layout(cls, layouts) -> PinnedLayout``
(fails closed on an unknown field list); ``field_names(cls)``; ``FieldRule``.

A layout is the exact dataclass field list of one engine class at one upstream
revision, read from the upstream source and kept as data
(``afd_split/engine/pinned/*.json``, each naming its version and commit).
The run-time drift check compares ``dataclasses.fields(type(obj))`` with the
pinned lists: any added, removed or renamed field fails closed, naming it,
instead of being copied from the parent batch into both ubatches.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType

from afd_split.errors import UnsupportedSplitError

PINNED_PACKAGE = "afd_split.engine.pinned"


class FieldRule(enum.Enum):
    """What a ubatch does with one field of the parent's metadata."""

    RECOMPUTE = "recompute"
    """Derived per ubatch from the plan and the parent's host (``*_cpu``) values."""
    TOKEN_ROWS = "token_rows"
    """Token-indexed: the ubatch's rows of the parent (a view when they are contiguous)."""
    REQUEST_ROWS = "request_rows"
    """Request-indexed: the ubatch's request slice of the parent (a view)."""
    KEEP = "keep"
    """Batch-invariant (e.g. ``causal=True``): shared with the parent."""
    CLEAR = "clear"
    """A lazily filled cache of the parent: None in the ubatch, rebuilt on demand."""
    FRESH_BUFFER = "fresh_buffer"
    """A kernel output buffer: each ubatch gets its own, so stages cannot overwrite each other,
    with one entry per row of the ubatch, as the token-sized runner buffer it stands for
    bounds what the kernel writes (``common.fresh_stage_buffer``)."""
    REJECT_WHEN_SET = "reject_when_set"
    """A feature the split cannot honour: fail closed, naming the field, unless unset."""


@dataclass(frozen=True)
class PinnedLayout:
    """One pinned field list: which class, at which upstream version and commit."""

    name: str
    class_name: str
    version: str
    commit: str
    source: str
    fields: tuple[str, ...]
    extra: MappingProxyType

    @functools.cached_property
    def field_set(self) -> frozenset[str]:
        """The field names, order-insensitive (computed once: the engine path reads it per step)."""
        return frozenset(self.fields)

    def __hash__(self) -> int:
        # Explicit (``extra`` is a mapping, so the generated hash would fail): layouts key the
        # per-class match cache; name and commit identify one pinned list.
        return hash((self.name, self.commit))

    def describe(self) -> str:
        """Short provenance for error messages and evidence."""
        return f"{self.class_name} {self.version} (commit {self.commit})"


def load_layout(name: str) -> PinnedLayout:
    """The pinned layout stored as ``afd_split/engine/pinned/<name>.json``."""
    data = json.loads(resources.files(PINNED_PACKAGE).joinpath(f"{name}.json").read_text())
    known = {"class", "version", "commit", "source", "fields"}
    return PinnedLayout(
        name=name,
        class_name=data["class"],
        version=data["version"],
        commit=data["commit"],
        source=data["source"],
        fields=tuple(data["fields"]),
        extra=MappingProxyType({k: v for k, v in data.items() if k not in known}),
    )


def field_names(cls: type) -> tuple[str, ...]:
    """Dataclass field names of ``cls`` in declaration order."""
    return tuple(field.name for field in dataclasses.fields(cls))


MATCH_CACHE_SIZE = 64
"""Engine classes remembered by ``match_layout`` (a process sees one or two)."""


@functools.lru_cache(maxsize=MATCH_CACHE_SIZE)
def match_layout(cls: type, layouts: tuple[PinnedLayout, ...]) -> PinnedLayout:
    """The pinned layout whose field list ``cls`` has exactly; else fail closed naming the drift.

    The error lists, against the closest pinned layout, the fields the class
    added (unknown to every rule) and the ones it lost. Cached per class: a
    class's dataclass fields are fixed when it is defined, so the drift check
    runs once per engine class, not once per step (a failure is not cached:
    it raises again on every call).
    """
    names = frozenset(field_names(cls))
    for layout in layouts:
        if layout.field_set == names:
            return layout
    closest = min(layouts, key=lambda layout: len(layout.field_set ^ names))
    added = sorted(names - closest.field_set)
    missing = sorted(closest.field_set - names)
    raise UnsupportedSplitError(
        f"{cls.__module__}.{cls.__qualname__} matches no pinned layout "
        f"({', '.join(layout.version for layout in layouts)}); against the closest, "
        f"{closest.describe()}, it adds {added} and lacks {missing}: every field must be "
        "sliced or rejected by name, so an unknown layout is not split"
    )
