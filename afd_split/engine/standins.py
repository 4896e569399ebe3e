"""Structural stand-ins of the engine metadata classes, built from the pinned field lists.

vLLM and vLLM-Ascend do not install on the CPU hosts, so the adapter tests and
the CPU backend's engine path need a class with exactly an engine class's
dataclass fields and defaults (``afd_split/engine/pinned/*.json``, each
naming its upstream version and commit): the adapters' drift check then
matches it to that pinned layout, and every field rule runs as it would on the
real class. Nothing else is modelled: the properties the pinned data lists
(deprecated accessors that would copy from the device) raise when read, so an
adapter that reads one fails. One class per layout (cached), so the adapters'
per-class caches see one engine class, as in an engine process.
"""

from __future__ import annotations

import dataclasses
import enum
import functools

from afd_split.engine.layout import PinnedLayout

ATTN_STATE_ENUM_KEY = "attn_state_enum"
"""Pinned-data key of AscendAttentionState's members (name -> value)."""


def _deprecated(name: str) -> property:
    def read(self):
        raise RuntimeError(f"the adapter read {name}, a deprecated property (a device copy)")

    return property(read)


@functools.cache
def standin_class(layout: PinnedLayout) -> type:
    """A dataclass with exactly ``layout``'s fields and defaults; pinned properties raise."""
    specs = []
    for name in layout.fields:
        if name in layout.extra["required"]:
            specs.append((name, object))
        elif name in layout.extra.get("factories", {}):
            specs.append((name, object, dataclasses.field(default_factory=list)))
        else:
            specs.append((name, object, dataclasses.field(default=layout.extra["defaults"][name])))
    namespace = {name: _deprecated(name) for name in layout.extra["properties"]}
    return dataclasses.make_dataclass(layout.class_name, specs, namespace=namespace)


@functools.cache
def attn_state_enum(layout: PinnedLayout) -> type[enum.Enum]:
    """Stand-in of AscendAttentionState with the pinned member values."""
    return enum.Enum("AscendAttentionState", dict(layout.extra[ATTN_STATE_ENUM_KEY]))
