"""The notes column of a comparison: what besides the code differs between A and B."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_afd.report.loading import LoadedResult
from pytest_afd.report.noise import host_conditions, host_difference, share_difference
from pytest_afd.report.tables import EMPTY
from pytest_afd.report.values import stack_short_label

MAX_NAMED_DIFFERENCES = 3


def _differing_paths(a: Any, b: Any, path: str) -> list[str]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        found = []
        for key in sorted(set(a) | set(b)):
            found += _differing_paths(a.get(key), b.get(key), f"{path}.{key}" if path else key)
        return found
    return [] if a == b else [path]


def manifest_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The first differing manifest fields (dotted paths), the digest itself left out."""
    paths = [p for p in _differing_paths(a["manifest"], b["manifest"], "") if p != "digest"]
    shown = paths[:MAX_NAMED_DIFFERENCES]
    if len(paths) > MAX_NAMED_DIFFERENCES:
        shown.append(f"{len(paths) - MAX_NAMED_DIFFERENCES} more")
    return shown or ["the digest only"]


def notes(a: LoadedResult, b: LoadedResult) -> str:
    notes = []
    if a.digest != b.digest:
        left, right = stack_short_label(a.doc), stack_short_label(b.doc)
        notes.append(
            f"stacks {left} / {right}"
            if left != right
            else "manifests differ in " + ", ".join(manifest_differences(a.doc, b.doc))
        )
    if a.doc["workload"]["dataset"]["digest"] != b.doc["workload"]["dataset"]["digest"]:
        notes.append("workload differs: exploratory")
    if "exploratory" in (a.doc["labels"]["comparability"], b.doc["labels"]["comparability"]):
        notes.append("exploratory case")
    if a.status not in ("passed", "unknown") or b.status not in ("passed", "unknown"):
        notes.append(f"verdicts {a.status} / {b.status}")
    hosts = host_conditions(a.doc), host_conditions(b.doc)
    change = share_difference(*hosts) or host_difference(*hosts)
    if change is not None:
        notes.append(f"host conditions differ ({change})")
    elif None in hosts:
        notes.append("host conditions not recorded: a host difference cannot be ruled out")
    return "; ".join(notes) or EMPTY
