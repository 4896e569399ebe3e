"""``study publish RESULTS... --study FILE --output DIR``: the study's self-contained bundle (RFC step 8).

The bundle (docs/study-publish.md):

- ``study.md`` / ``study.html``: first line, whether it makes a production
  recommendation and why not; the operating regions; the limitations derived
  from the evidence; tested points, cases, profiler methodology, method; the
  raw files with their digests;
- ``regions.json`` (validated by ``schemas/regions.schema.json``);
- ``tables/{regions,points,cases}.csv`` and ``plots/*.png``;
- ``raw/``: every result read, byte for byte; ``study.json``: the study file;
- ``SHA256SUMS``: the sha256 of every file (``sha256sum -c SHA256SUMS``).

Exit status: 0 when the bundle is written, 2 for a usage error (a bad
study file, a missing results path, an output that is not an empty
directory, no valid result at all), each named with where it came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from pytest_afd.report import layout
from pytest_afd.report.html import markdown_to_html
from pytest_afd.report.loading import LoadedResult, LoadedResults
from pytest_afd.report.rendering import prepare_report_dir, render_markdown
from pytest_afd.results.documents import load_schema
from pytest_afd.study import effects, limitations, methodology, plots, regions, summary
from pytest_afd.study.bundle import (
    CASE_HEADER,
    RAW_DIR,
    Inputs,
    PublishError,
    case_rows,
    copy_raw,
    csv_text,
    read_inputs,
    write_sums,
)
from pytest_afd.study.bundle_html import study_page

REGIONS_FILE = "regions.json"
REGIONS_SCHEMA = "regions.schema.json"
REGIONS_KIND = "afd-study-regions"
STUDY_COPY = "study.json"
SUMMARY_FILE = "study.md"
PAGE_FILE = "study.html"
TABLES_DIR = "tables"
PLOTS_DIR = "plots"
STAGE_REPORT_DIR = "report"
STAGE_REPORT_PAGE = f"{STAGE_REPORT_DIR}/report.html"
USAGE_ERROR = 2
INTERVAL_NAME = ("Welch t interval on log repetitions (ratio of geometric means), computed once "
                 "at publication")
CALL_MEANINGS = {
    effects.TOKEN_BALANCED: "interval above 1 and effect above the minimum: use token_balanced",
    effects.REQUEST_BOUNDARY: "interval below 1 and effect above the minimum: keep request_boundary",
    effects.NO_DIFFERENCE: "interval within ± the minimum effect: no recommendation (no difference)",
    effects.UNDECIDED: "the evidence does not decide: no recommendation",
}


def validate_regions(doc: Any) -> None:
    """Raise PublishError naming each place ``doc`` breaks schemas/regions.schema.json."""
    validator = Draft202012Validator(load_schema(REGIONS_SCHEMA))
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        raise PublishError("regions.json does not match schemas/regions.schema.json: " + "; ".join(
            f"at /{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]))


def regions_document(study, series_docs, found, inputs: Inputs, headline: str,
                     production: bool) -> dict[str, Any]:
    return {
        "kind": REGIONS_KIND, "schema_version": 1, "headline": headline,
        "production_recommendation": production,
        "study": {"name": study["name"], "digest": study["digest"]},
        "method": {"axis": regions.AXIS, "control": regions.CONTROL, "proposed": regions.PROPOSED,
                   "interval": INTERVAL_NAME, "confidence": effects.CONFIDENCE,
                   "min_effect": effects.MIN_EFFECT, "calls": CALL_MEANINGS},
        "series": series_docs,
        "limitations": [item.to_json() for item in found],
        "excluded": [{"case_id": e.case_id, "source": e.source, "contradictions": [
            {"field": c.field, "study_value": c.study_value, "run_value": c.run_value}
            for c in e.fields]} for e in inputs.excluded],
        "included_cases": sorted(doc["case_id"] for _, doc in inputs.included),
    }


def _prepare_output(output: Path) -> None:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise PublishError(f"--output {output}: exists and is not an empty directory "
                           "(a bundle is written once; choose a new directory)")
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PublishError(f"--output {output}: cannot create it ({exc.strerror})") from None


def _write_plots(series_docs, output: Path) -> dict[int, tuple[str, str]]:
    placed = {}
    for index, series in enumerate(series_docs):
        title = plots.series_title(series)
        figure = plots.draw_series(series, title)
        if figure is not None:
            written = layout.save(figure, output / PLOTS_DIR / plots.series_file(index))
            if written is not None:
                placed[index + 1] = (written.relative_to(output).as_posix(), title)
    return placed


def write_stage_report(included: list[tuple[Path, dict[str, Any]]], raw: list[tuple[str, str]],
                       output: Path) -> None:
    """The report's per-stage tables and plots of the included results (``report/``), read from
    their raw copies: the same tables ``python -m pytest_afd report`` makes, one per stage and stack."""
    report_dir = output / STAGE_REPORT_DIR
    prepare_report_dir(report_dir)
    loaded = LoadedResults(results=[LoadedResult(output / name, doc)
                                    for (name, _), (_, doc) in zip(raw, included, strict=False)])
    text = render_markdown(loaded, Path(RAW_DIR), report_dir, all_sessions=True)
    (report_dir / "report.md").write_text(text + "\n")
    (report_dir / "report.html").write_text(markdown_to_html(text, "study results by stage",
                                                             base_dir=report_dir))


def publish(sources: list[Path], study_path: Path, output: Path) -> dict[str, Any]:
    """Write the bundle; returns regions.json's document."""
    from pytest_afd.study.check import StudyError, load_study  # d41's reader (digest checked)

    try:
        study = load_study(study_path)
    except (StudyError, OSError, ValueError) as exc:
        raise PublishError(f"--study {study_path}: {exc}") from None
    for source in sources:
        if not source.exists():
            raise PublishError(f"results path {source} (RESULTS argument) does not exist")
    inputs = read_inputs(sources, study)
    if not inputs.included and not inputs.excluded:
        raise PublishError("no valid result under " + ", ".join(map(str, sources))
                           + (f" ({len(inputs.unusable)} unusable file(s))" if inputs.unusable else ""))
    _prepare_output(output)
    docs = [doc for _, doc in inputs.included]
    points = regions.tested_points(docs)
    series_docs = regions.all_series(points)
    production = sum(region["label"] == regions.PRODUCTION
                     and region["recommendation"] != effects.NO_RECOMMENDATION
                     for series in series_docs for region in series["regions"])
    found = limitations.derive_limitations(docs, study, exclusions=inputs.excluded,
                                           pairs=len(points))
    headline = limitations.headline_line(docs, production)
    doc = regions_document(study, series_docs, found, inputs, headline, production > 0)
    validate_regions(doc)
    raw = copy_raw(inputs, output)
    write_stage_report(inputs.included, raw, output)
    (output / STUDY_COPY).write_bytes(study_path.read_bytes())
    (output / REGIONS_FILE).write_text(json.dumps(doc, indent=2) + "\n")
    tables = output / TABLES_DIR
    tables.mkdir()
    (tables / "regions.csv").write_text(csv_text(summary.REGION_HEADER,
                                                 summary.region_rows(series_docs)))
    (tables / "points.csv").write_text(csv_text(summary.POINT_HEADER,
                                                summary.point_rows(series_docs)))
    (tables / "cases.csv").write_text(csv_text(CASE_HEADER, case_rows(docs)))
    placed = _write_plots(series_docs, output)
    markdown = summary.render(
        headline=headline, study=study, series_docs=series_docs, plots=placed, limitations=found,
        exclusions=inputs.excluded, docs=docs, methodology=methodology.methodology_lines(docs),
        raw=raw, unusable=[(str(p), why) for p, why in inputs.unusable],
        counts={"read": len(docs) + len(inputs.excluded), "included": len(docs),
                "excluded": len(inputs.excluded), "unusable": len(inputs.unusable)})
    (output / SUMMARY_FILE).write_text(markdown)
    (output / PAGE_FILE).write_text(study_page(markdown, f"Study {study['name']}", output))
    write_sums(output)
    return doc


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=(
        "Publish a study: raw results with digests, tables, plots, profiler methodology, "
        "operating regions (regions.json) with derived limitations, and study.html."))
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULTS",
                        help="results directories or result files (every session is read)")
    parser.add_argument("--study", required=True, type=Path, metavar="FILE",
                        help="the frozen study file (study freeze)")
    parser.add_argument("--output", required=True, type=Path, metavar="DIR",
                        help="a new or empty directory for the bundle")
    return parser


def main(argv: list[str] | None = None, prog: str = "pytest-afd study publish") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        doc = publish(args.results, args.study, args.output)
    except PublishError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print(doc["headline"])
    regions_count = sum(len(series["regions"]) for series in doc["series"])
    print(f"{regions_count} region(s), {len(doc['limitations'])} limitation(s), "
          f"{len(doc['excluded'])} excluded result(s): {args.output / PAGE_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
