"""Does a published bundle agree with itself? (used by the publication tests and the end-to-end study)

:func:`bundle_problems` re-reads a bundle from disk and names every
disagreement: ``regions.json`` against ``schemas/regions.schema.json``; every
file against ``SHA256SUMS``; each region and point of ``regions.json``
against its row in ``tables/regions.csv`` / ``tables/points.csv`` (call,
recommendation, realized-imbalance range, effect and interval, supporting
cases); each region's range against its own points; the first line of
``study.md`` against the headline. An empty list means the bundle's regions
agree with its own tables.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from pytest_afd.results.documents import load_schema

TOLERANCE = 1e-4  # the CSV tables print four decimals
SUMS_FILE = "SHA256SUMS"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _close(cell: str, value: Any) -> bool:
    if not isinstance(value, (int, float)):
        return cell == "-"
    try:
        return abs(float(cell) - value) <= TOLERANCE
    except ValueError:
        return False


def _interval_problems(where: str, row: Mapping[str, str], prefix: str, interval: Any,
                       columns: tuple[str, str, str]) -> list[str]:
    known = isinstance(interval, Mapping) and "ratio" in interval
    values = [interval[k] for k in ("ratio", "low", "high")] if known else [None] * 3
    return [f"{where}: {prefix} {column} {row[column]!r} != regions.json {value!r}"
            for column, value in zip(columns, values, strict=True) if not _close(row[column], value)]


def _sums_problems(bundle: Path) -> list[str]:
    sums = bundle / SUMS_FILE
    if not sums.is_file():
        return [f"{SUMS_FILE} is missing"]
    problems, listed = [], set()
    for line in sums.read_text().splitlines():
        digest, _, name = line.partition("  ")
        listed.add(name)
        path = bundle / name
        if not path.is_file():
            problems.append(f"{SUMS_FILE} lists {name}, which is missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problems.append(f"{name}: sha256 differs from {SUMS_FILE}")
    unlisted = sorted(p.relative_to(bundle).as_posix() for p in bundle.rglob("*")
                      if p.is_file() and p.name != SUMS_FILE
                      and p.relative_to(bundle).as_posix() not in listed)
    return problems + [f"{name}: not in {SUMS_FILE}" for name in unlisted]


def _region_problems(region: Mapping[str, Any], row: Mapping[str, str] | None) -> list[str]:
    where = f"region {region['id']}"
    if row is None:
        return [f"{where}: no row in tables/regions.csv"]
    problems = [f"{where}: {key} {row[key]!r} != regions.json {region[key]!r}"
                for key in ("call", "recommendation", "label") if row[key] != region[key]]
    span = region["conditions"]["realized_imbalance"]
    for column, key in (("imbalance low", "low"), ("imbalance high", "high")):
        if not _close(row[column], span.get(key) if "low" in span else None):
            problems.append(f"{where}: {column} {row[column]!r} != regions.json {span!r}")
    problems += _interval_problems(where, row, "", region["effect"]["prefill_tokens_per_s"],
                                   ("tokens/s ratio", "tokens/s low", "tokens/s high"))
    problems += _interval_problems(where, row, "", region["effect"]["ttft_p50"],
                                   ("TTFT p50 ratio", "TTFT low", "TTFT high"))
    if sorted(row["cases"].split()) != sorted(region["cases"]):
        problems.append(f"{where}: cases in tables/regions.csv differ from regions.json")
    axis = [p["realized_imbalance"] for p in region["points"]
            if isinstance(p["realized_imbalance"], (int, float))]
    if axis and "low" in span and (min(axis), max(axis)) != (span["low"], span["high"]):
        problems.append(f"{where}: range {span!r} is not its points' {min(axis)}..{max(axis)}")
    if any(p["call"] != region["call"] for p in region["points"]):
        problems.append(f"{where}: a point's call differs from the region's {region['call']!r}")
    return problems


def _point_problems(region: Mapping[str, Any], rows: list[dict[str, str]]) -> list[str]:
    where = f"region {region['id']}"
    if len(rows) != len(region["points"]):
        return [f"{where}: {len(rows)} row(s) in tables/points.csv for {len(region['points'])} points"]
    problems = []
    for point, row in zip(region["points"], rows, strict=True):
        at = f"{where} point {point['condition']}"
        if row["condition"] != point["condition"] or row["call"] != point["call"]:
            problems.append(f"{at}: tables/points.csv says {row['condition']!r} {row['call']!r}")
        problems += _interval_problems(at, row, "", point["prefill_tokens_per_s"],
                                       ("tokens/s ratio", "tokens/s low", "tokens/s high"))
    return problems


def bundle_problems(bundle: str | Path) -> list[str]:
    """Every way ``bundle`` disagrees with itself (empty: it agrees)."""
    bundle = Path(bundle)
    try:
        doc = json.loads((bundle / "regions.json").read_text())
    except (OSError, ValueError) as exc:
        return [f"regions.json unreadable: {exc}"]
    problems = [f"regions.json at /{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in Draft202012Validator(load_schema("regions.schema.json")).iter_errors(doc)]
    if problems:
        return problems
    problems += _sums_problems(bundle)
    first = (bundle / "study.md").read_text().split("\n", 1)[0]
    if first != doc["headline"]:
        problems.append(f"study.md's first line {first!r} is not the headline")
    regions_rows = {row["region"]: row for row in _rows(bundle / "tables" / "regions.csv")}
    point_rows = _rows(bundle / "tables" / "points.csv")
    seen = []
    for series in doc["series"]:
        for region in series["regions"]:
            seen.append(region["id"])
            problems += _region_problems(region, regions_rows.get(region["id"]))
            problems += _point_problems(region, [r for r in point_rows if r["region"] == region["id"]])
    extra = sorted(set(regions_rows) - set(seen))
    return problems + [f"tables/regions.csv has region {rid} that regions.json lacks" for rid in extra]
