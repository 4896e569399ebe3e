"""Interleaved A/B inside one session: ``--afd-ab "chunk_size=8192" "chunk_size=16384"``.

Two sessions on a busy host differ by far more than two option sets usually do
(docs/report.md, "Between-session noise"). For a user who can pay for twice the
runs, ``--afd-ab A B`` measures every stage case twice in the same schedule,
once with option set A and once with B (comma-separated ``field=value``
overrides of :class:`~pytest_afd.core.backend.RunSettings`), alternating A and
B repetition by repetition (the stages' ``interleaved`` run order). The two
results are ``<case>/ab-A`` and ``<case>/ab-B``: each stage's "Fastest per
condition" table compares them per case, and the verdict adds the stage-wide
B / A (:func:`pytest_afd.stats.conclusions.ab_text`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_afd.core.backend import RunSettings

FLAG = "--afd-ab"
SIDES = ("ab-A", "ab-B")
# Two deployments or code versions (pytest_afd.run.ab_sides): both sides keep the case's settings.
SAME_SETTINGS: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
NONE_WORDS = ("none", "null", "unchunked")
BOOLEAN_WORDS = {"true": True, "false": False}
# Fields that say how a run is measured, not what runs: never A/B options.
NOT_OPTIONS = frozenset(("instrument", "return_logits"))


def add_option(group: Any) -> None:
    group.addoption(
        FLAG, nargs=2, default=None, metavar=("A", "B"), dest="afd_ab",
        help="interleaved A/B in one session: run every stage case with option set A and with "
             "B (comma-separated RunSettings field=value, e.g. chunk_size=8192), alternating "
             "repetition by repetition; results <case>/ab-A and <case>/ab-B",
    )


def _value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in NONE_WORDS:
        return None
    if lowered in BOOLEAN_WORDS:
        return BOOLEAN_WORDS[lowered]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text.strip()


def parse_side(text: str, side: str, source: str = FLAG) -> dict[str, Any]:
    """``"chunk_size=8192,prefix_caching=true"`` -> overrides; ValueError naming the bad part."""
    fields = {f.name for f in dataclasses.fields(RunSettings)} - NOT_OPTIONS
    overrides: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{source} {side} {text!r}: {part!r} is not field=value")
        if name.strip() not in fields:
            raise ValueError(f"{source} {side} {text!r}: unknown field {name.strip()!r}; "
                             f"expected one of {sorted(fields)}")
        overrides[name.strip()] = _value(value)
    if not overrides:
        raise ValueError(f"{source} {side} {text!r}: no field=value given")
    return overrides


def parse(values: Sequence[str] | None, source: str = FLAG
          ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Both sides' overrides, or None without the flag."""
    if not values:
        return None
    a, b = values
    return parse_side(a, "A", source), parse_side(b, "B", source)


def side_settings(settings: RunSettings, overrides: Mapping[str, Any]) -> RunSettings:
    return dataclasses.replace(settings, **overrides)
