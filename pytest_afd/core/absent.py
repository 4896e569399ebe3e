"""The one convention for a value unknown here: ``{"value": None, "absent_reason": reason}``.

A module of its own so that host probing, manifest assembly and results all use
it without importing each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def absent(reason: str) -> dict[str, Any]:
    """The one convention for a value unknown here: ``{"value": None, "absent_reason": reason}``."""
    if not reason or not reason.strip():
        raise ValueError("absent() needs a non-empty reason")
    return {"value": None, "absent_reason": reason}


def is_absent(value: Any) -> bool:
    """Whether ``value`` is an :func:`absent` record (a figure a consumer must skip, not read as 0)."""
    return isinstance(value, Mapping) and value.get("value", 0) is None and "absent_reason" in value
