"""The report of one results directory: report.md, report.html and plots/*.png.

Results are grouped by stage (``case_kind``) and by stack (manifest digest;
labelled by what ran: backend and mode, model and layers, topology). Cases of
different stacks are never in one table or plot, except Stage F's AFD-vs-PP
pairs, which are drawn side by side and marked comparable or exploratory. By
default only the latest session is reported (``all_sessions`` for everything).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_afd.core.markers import MARKERS, STAGE_MARKERS
from pytest_afd.report import layout
from pytest_afd.report.gates import MAX_PLOTTED_GATES, gates_section
from pytest_afd.report.html import markdown_to_html
from pytest_afd.report.interruptions import interrupted_lines
from pytest_afd.report.loading import (
    REPORT_DIR_NAME,
    LoadedResult,
    LoadedResults,
    load_results,
    session_label,
    verdict_rank,
)
from pytest_afd.report.plots import PLOTTERS, plot_note
from pytest_afd.report.point_plots import imbalance_key
from pytest_afd.report.profile_table import profile_table
from pytest_afd.report.sidebyside import draw_side_by_side
from pytest_afd.report.tables import (
    EMPTY,
    afd_pp_pairs,
    case_table,
    cell,
    comparison_table,
    pair_table,
    parity_text,
    short_digest,
    table,
    verdict_text,
    workload_table,
)
from pytest_afd.report.values import stack_description, stack_short_label
from pytest_afd.results import profile_ledger
from pytest_afd.stats import conclusions, session_noise, verdicts

REPORT_FILE_NAME = "report.md"
HTML_FILE_NAME = "report.html"
PLOTS_DIR_NAME = "plots"
GATE_KIND = "gate"
OTHER_KINDS = (GATE_KIND, "benchmark", "other")
FAILED_STATUSES = ("failed", "error")
IMBALANCE_PLOT = "imbalance_vs_step_time"
IMBALANCE_KEY_HEADER = ("#", "condition", "policy", "mean imbalance", "step time (s)", "")
NO_PLOTS_LINE = "Plots were not drawn (`--no-plots`): tables and conclusions only."


class ReportError(ValueError):
    """A report cannot be written where it was asked (the message names the path)."""


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._") or "x"


def _plot_lines(figure, report_dir: Path | None, file_name: str, caption: str) -> list[str]:
    """The plot's markdown lines; none when nothing was drawn or plots are off (no directory)."""
    if figure is None or report_dir is None:
        return []
    written = layout.save(figure, report_dir / PLOTS_DIR_NAME / file_name)
    if written is None:
        return []
    relative = written.relative_to(report_dir).as_posix()
    return [f"![{caption}]({relative})", "", f"*{caption}.*", ""]


def _pairs_section(results: Sequence[LoadedResult], report_dir: Path | None) -> list[str]:
    """Stage F: each AFD-vs-PP pair side by side, across their two stacks, with its parity."""
    pairs = afd_pp_pairs(results)
    if not pairs:
        return []
    lines = ["### AFD vs PP, side by side", "", *pair_table(pairs), ""]
    for name, afd, pp in pairs:
        label = f"AFD {stack_short_label(afd.doc)} vs PP {stack_short_label(pp.doc)}"
        rows = [(label, afd.doc, pp.doc)]
        title = f"{name}: {parity_text(afd)}"
        figure = None if report_dir is None else draw_side_by_side(rows, ("AFD", "PP"), title)
        lines += _plot_lines(
            figure,
            report_dir,
            f"stage_f-{slug(name)}-afd_vs_pp.png",
            f"AFD vs PP ({parity_text(afd)})",
        )
    return lines


def _fastest_lines(results: Sequence[LoadedResult]) -> list[str]:
    """Every condition's fastest variant, references included: what the conclusion says."""
    header, rows = conclusions.fastest_table([r.doc for r in results])
    if not any(row[3] != EMPTY for row in rows):
        return []
    return ["Fastest per condition (median prefill tokens/s; references `none` and "
            f"`unchunked` compete too; {session_noise.UNCALIBRATED_RULE}):", "",
            *table(header, rows), ""]


def _stack_section(
    stage: str, digest: str, results: list[LoadedResult], report_dir: Path | None
) -> list[str]:
    lines = [
        f"### Stack `{short_digest(digest)}`: {stack_short_label(results[0].doc)}",
        "",
        f"{stack_description(results[0].doc)}; {len(results)} case(s).",
        "",
        *case_table(results),
        "",
        *comparison_table(results),
        *_fastest_lines(results),
        "Workloads:",
        "",
        *workload_table(results),
        "",
        *profile_table(results),
    ]
    for name, caption, draw in PLOTTERS if report_dir is not None else ():
        file_name = f"{slug(stage)}-{short_digest(digest)}-{name}.png"
        caption = caption + plot_note(name, results)
        drawn = _plot_lines(draw(results), report_dir, file_name, caption)
        lines += drawn
        if drawn and name == IMBALANCE_PLOT:
            lines += ["Key to the numbered points:", "",
                      *table(IMBALANCE_KEY_HEADER, imbalance_key(results)), ""]
    return lines


def _section(stage: str, stacks: Mapping[str, list[LoadedResult]],
             report_dir: Path | None) -> list[str]:
    lines = [f"## {stage}: {MARKERS.get(stage, stage)}", ""]
    if len(stacks) > 1:
        lines += [
            f"These results come from {len(stacks)} different stacks (manifest digests); "
            "they are reported separately and never compared across stacks"
            + (" (except the AFD-vs-PP pairs below)." if stage == "stage_f" else "."),
            "",
        ]
    if stage == "stage_f":
        lines += _pairs_section([r for rs in stacks.values() for r in rs], report_dir)
    ordered = sorted(stacks.items(), key=lambda item: (stack_short_label(item[1][0].doc), item[0]))
    for digest, results in ordered:
        lines += _stack_section(stage, digest, results, report_dir)
    return lines


def _stacks_overview(results: Sequence[LoadedResult]) -> list[str]:
    by_digest: dict[str, list[LoadedResult]] = defaultdict(list)
    for result in results:
        by_digest[result.stack].append(result)
    rows = [
        [
            f"`{short_digest(d)}`",
            stack_short_label(rs[0].doc),
            stack_description(rs[0].doc),
            str(len(rs)),
        ]
        for d, rs in sorted(by_digest.items(), key=lambda item: stack_short_label(item[1][0].doc))
    ]
    lines = ["## Stacks", "", *table(("stack", "label", "description", "cases"), rows)]
    if len(by_digest) > 1:
        lines += [
            "",
            f"{len(by_digest)} stacks are present. Only cases with the same manifest digest "
            "are compared; each stage section keeps stacks apart.",
        ]
    return [*lines, ""]


def _sessions_lines(loaded: LoadedResults, all_sessions: bool) -> list[str]:
    sessions = sorted({session_label(r.session) for r in loaded.results})
    if all_sessions:
        return [f"Sessions: all ({len(sessions)}: {', '.join(sessions)}).", ""] if sessions else []
    if not loaded.results:
        return []
    text = f"Session: {sessions[0]} (the latest)."
    if loaded.earlier:
        earlier = {session_label(r.session) for r in loaded.earlier}
        text += (
            f" {len(loaded.earlier)} result(s) of {len(earlier)} earlier session(s) are not "
            "shown; `--all-sessions` reports everything."
        )
    return [text, ""]


def _gate_lines(results: Sequence[LoadedResult], report_dir: Path | None) -> list[str]:
    """Gates in their own section: logit error against tolerance, one figure for all."""
    table_lines, figure = gates_section(results, draw=report_dir is not None)
    shown = min(len(results), MAX_PLOTTED_GATES)
    caption = "Gate logit error / atol per case (line: the tolerance)" + (
        f"; the first {shown} of {len(results)} cases" if len(results) > shown else "")
    return [f"## {GATE_KIND}: {MARKERS[GATE_KIND]}", "", *table_lines,
            *_plot_lines(figure, report_dir, "gates-logit_error.png", caption)]


def _verdicts(results: Sequence[LoadedResult]) -> list[str]:
    """The report's first section: Stage A's ranking, then every stage's conclusion."""
    docs = [r.doc for r in results]
    lines = ["## Verdicts", ""]
    profiles = profile_ledger.count_docs(docs)
    if profiles.instrumented:  # issue 45: a lost profile is said for the session, not per case only
        warning = profiles.warning()
        lines += [f"**{profiles.line(False)}**" + (f"; {warning}" if warning else "") + ".", ""]
    rankings = verdicts.stage_a_rankings(docs)
    stage_a_docs = [r.doc for r in results if r.stage == "stage_a"]
    for test, ranking in rankings:
        lines += [f"**Stage A ({test})**: {verdicts.ranking_text(ranking, stage_a_docs)}.", ""]
    if not rankings and any(r.stage == "stage_a" for r in results):
        lines += ["**Stage A**: no result carries `evidence.stage_a.ranking` (no ranking ran).", ""]
    stages = verdicts.by_stage(docs)
    rows = [
        [f"[{stage}](#{slug(stage)})", verdicts.stage_conclusion(stages[stage])]
        for stage in (*STAGE_MARKERS, *OTHER_KINDS)
        if stage in stages
    ]
    return [*lines, *table(("stage", "conclusion"), rows), ""]


def _failures(results: Sequence[LoadedResult]) -> list[str]:
    failed = sorted((r for r in results if r.status in FAILED_STATUSES), key=verdict_rank)
    if not failed:
        return []
    rows = [[r.case_id, r.stage, verdict_text(r)] for r in failed]
    return ["## Failures", "", *table(("case", "stage", "verdict"), rows), ""]


def render_markdown(
    loaded: LoadedResults, results_dir: Path, report_dir: Path | None, *,
    all_sessions: bool = False
) -> str:
    """The report's markdown; ``report_dir`` None draws no plots (``--no-plots``)."""
    lines = [
        "# pytest-afd report",
        "",
        f"Results directory: `{results_dir}`; {len(loaded.results)} result(s) reported, "
        f"{len(loaded.skipped)} file(s) skipped.",
        "",
        *_sessions_lines(loaded, all_sessions),
        *interrupted_lines(results_dir, (r.session for r in loaded.results)),
        *([NO_PLOTS_LINE, ""] if report_dir is None else []),
    ]
    if loaded.legacy:
        lines += [
            f"{loaded.legacy} result(s) predate recorded outcomes, sessions and run identities "
            "(legacy): their verdict is unknown and their run identity is derived from the "
            "manifest they carry.",
            "",
        ]
    if loaded.ignored:
        names = ", ".join(f"`{path.relative_to(results_dir)}`" for path in loaded.ignored)
        lines += [f"Other JSON files (not results, not read): {names}.", ""]
    lines += [
        "Headline numbers are medians over measured repetitions (after warmup) of "
        "non-instrumented runs; cv is the coefficient of variation. Imbalance is "
        "|t0 - t1| / T of the realized ubatches. Verdict is the test's outcome "
        "(unknown: written before outcomes were recorded).",
        "",
    ]
    if not loaded.results:
        lines += ["No result documents were found.", ""]
    else:
        lines += _verdicts(loaded.results)
        lines += _failures(loaded.results)
        lines += _stacks_overview(loaded.results)
    by_stage: dict[str, dict[str, list[LoadedResult]]] = defaultdict(lambda: defaultdict(list))
    for result in loaded.results:
        by_stage[result.stage][result.stack].append(result)
    for stage in (*STAGE_MARKERS, *OTHER_KINDS):
        if stage == GATE_KIND and stage in by_stage:
            lines += _gate_lines([r for rs in by_stage[stage].values() for r in rs], report_dir)
        elif stage in by_stage:
            lines += _section(stage, by_stage[stage], report_dir)
    if loaded.skipped:
        lines += ["## Skipped files", "", "| file | reason |", "|---|---|"]
        for path, reason in loaded.skipped:
            lines.append(f"| `{path.relative_to(results_dir)}` | {cell(reason)} |")
        lines.append("")
    return "\n".join(lines)


def prepare_report_dir(report_dir: Path) -> Path:
    """Create ``report_dir/plots`` and drop stale plots; ReportError naming the path otherwise."""
    if report_dir.exists() and not report_dir.is_dir():
        raise ReportError(f"--output {str(report_dir)!r} is a file, not a directory")
    plots_dir = report_dir / PLOTS_DIR_NAME
    try:
        plots_dir.mkdir(parents=True, exist_ok=True)
        for stale in plots_dir.glob("*.png"):
            stale.unlink()
    except OSError as exc:
        raise ReportError(
            f"cannot write the report under {str(report_dir)!r}: {exc.strerror or exc}"
        ) from None
    return plots_dir


def render(
    results_dir: str | Path, output_dir: str | Path | None = None, *, all_sessions: bool = False,
    plots: bool = True,
) -> Path:
    """Write ``report.md``, ``report.html`` and ``plots/*.png``; returns report.md's path.

    ``plots=False`` (``--no-plots``) writes the tables and conclusions only: drawing and
    saving the figures is most of a report's time (matplotlib's layout and PNG encoding),
    which a nightly job that reads the verdicts, or a quick look, does not need."""
    source = Path(results_dir)
    if not source.is_dir():
        raise FileNotFoundError(f"results directory {str(source)!r} does not exist")
    report_dir = Path(output_dir) if output_dir is not None else source / REPORT_DIR_NAME
    prepare_report_dir(report_dir)
    loaded = load_results(source, exclude=report_dir, latest_only=not all_sessions)
    text = render_markdown(loaded, source, report_dir if plots else None,
                           all_sessions=all_sessions)
    target = report_dir / REPORT_FILE_NAME
    target.write_text(text + "\n")
    (report_dir / HTML_FILE_NAME).write_text(
        markdown_to_html(text, "pytest-afd report", base_dir=report_dir)
    )
    return target
