"""The written A/A-aware comparison: compare.md, compare.html and the plots.

The per-case calls come from :mod:`pytest_afd.report.compare`, the stage-wide ones from
:mod:`pytest_afd.report.stage_calls` (which builds on it); this module only renders both.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from pytest_afd.core.markers import STAGE_MARKERS
from pytest_afd.report import layout, stage_calls
from pytest_afd.report.compare import (
    BOOTSTRAP_SAMPLES,
    BOOTSTRAP_SEED,
    COMPARE_FILE_NAME,
    COMPARE_HTML_NAME,
    CONFIDENCE,
    DEFAULT_COMPARE_DIR,
    HEADER,
    METRICS,
    NO_DIFFERENCE,
    NOT_MEASURED,
    OTHER_KINDS,
    CaseComparison,
    compare_results,
)
from pytest_afd.report.html import markdown_to_html
from pytest_afd.report.noise import (
    CPU_CONTENTION_FLOOR,
    CPU_SHARE_TOLERANCE,
    INCONCLUSIVE_HOST,
    Calibration,
)
from pytest_afd.report.rendering import PLOTS_DIR_NAME, prepare_report_dir, slug
from pytest_afd.report.selection import Side, legend_names
from pytest_afd.report.sidebyside import draw_side_by_side
from pytest_afd.report.tables import EMPTY, table
from pytest_afd.report.values import measured_stats, throughput
from pytest_afd.stats import session_noise


def _side_figure(comparisons: Sequence[CaseComparison], title: str, names: tuple[str, str]):
    """A and B bars per shared case; a significant throughput call is part of the label."""
    rows = [c for c in comparisons if measured_stats(throughput(c.a.doc)) is not None]
    if not rows:
        return None
    labelled = []
    for comparison in rows:
        call = comparison.rows[0][-1]
        mark = f" [{call}]" if call not in (NO_DIFFERENCE, NOT_MEASURED) else ""
        labelled.append(
            (
                f"{comparison.condition} / {comparison.a.policy}{mark}",
                comparison.a.doc,
                comparison.b.doc,
            )
        )
    return draw_side_by_side(labelled, names, title)


def default_output(side_a: Side, side_b: Side) -> Path:
    """``./afd-compare/<A>-vs-<B>``: beside neither input, so neither side's folder changes."""
    return Path.cwd() / DEFAULT_COMPARE_DIR / (
        f"{slug(side_a.results_dir.name or 'a')}-vs-{slug(side_b.results_dir.name or 'b')}")


def render_comparison(
    side_a: Side,
    side_b: Side,
    output_dir: Path | None = None,
    *,
    calibration: Calibration | None = None,
) -> tuple[Path, list[str]]:
    """Write compare.md, compare.html and plots; (compare.md's path, the terminal verdict).

    ``calibration`` (a stored A/A calibration of this host) replaces the
    conservative between-session rule by the measured noise.
    """
    a, b = side_a.load(), side_b.load()
    target = output_dir or default_output(side_a, side_b)
    prepare_report_dir(target)
    comparisons = compare_results(a, b, calibration)
    stages = stage_calls.stage_calls(comparisons, calibration)
    calls = stage_calls.case_calls(comparisons)
    noise_rule = (
        f"the A/A calibration {calibration.name!r} ({calibration.path}, {calibration.runs} "
        "runs): a case's change must beat that case's widest A/A deviation, a stage-wide "
        "change the stage's" if calibration is not None else session_noise.UNCALIBRATED_RULE)
    called = [f"{c.case_id.rpartition('::')[2]} {row[0]}: {row[5]} x{row[3]}"
              for c in comparisons for row in c.rows if row[5].startswith(("B better", "B worse"))]
    verdict = stage_calls.verdict_line(comparisons, stages)
    terminal = [
        verdict,
        f"A: {side_a.name} ({len(a)} cases)  B: {side_b.name} ({len(b)} cases); "
        f"{len(comparisons)} shared",
        f"between-session noise: {noise_rule}",
        *stage_calls.terminal_table(stage_calls.STAGE_HEADER, [c.cells() for c in stages]),
        "per-case calls: " + (", ".join(f"{k}: {n}" for k, n in sorted(calls.items())) or EMPTY),
        *(f"  {line}" for line in called),
    ]
    lines = [
        "# pytest-afd comparison",
        "",
        f"**{verdict}**",
        "",
        f"A: `{side_a.name}` ({len(a)} cases). B: `{side_b.name}` ({len(b)} cases).",
        "",
        f"{len(comparisons)} shared case(s); {len(set(a) - set(b))} only in A, "
        f"{len(set(b) - set(a))} only in B.",
        "",
        "B / A is the ratio of medians over measured repetitions; the interval is a "
        f"{CONFIDENCE:.0%} bootstrap interval of that ratio ({BOOTSTRAP_SAMPLES} resamples, "
        f"seed {BOOTSTRAP_SEED}). A change is called only when the interval excludes 1, "
        "the min-max ranges of A and B do not overlap, B / A lies beyond the noise between "
        f"sessions on this host ({noise_rule}) and, for wall-time metrics, CPU time moved the "
        f"same way; otherwise: {NO_DIFFERENCE}. Contention is judged by the CPU share each "
        "repetition got (CPU time / wall time), not by the lagging load average: when A's "
        f"and B's median shares differ by more than {CPU_SHARE_TOLERANCE:.0%} (or the CPU "
        f"counts differ), wall-time metrics are '{INCONCLUSIVE_HOST} (CPU share a → b ...)' "
        f"and CPU time must also beat {CPU_CONTENTION_FLOOR:.0%} (what contention can add to "
        "the same work), or is inconclusive too when either side's load exceeded its CPU "
        "count. Results without per-repetition CPU times keep the load rule (1-minute load "
        "per CPU further apart than 0.5).",
        "",
        "## Stage-wide calls",
        "",
        "Geometric mean of the stage's per-case B / A, with a bootstrap interval over its "
        "cases: a change of the code moves every case, session noise moves them every "
        "which way.",
        "",
        *table(stage_calls.STAGE_HEADER, [c.cells() for c in stages]),
        "",
        "Per-case calls: " + (", ".join(f"{call}: {n}" for call, n in sorted(calls.items()))
                              or EMPTY) + ".",
        "",
    ]
    by_stage: dict[str, list[CaseComparison]] = defaultdict(list)
    names = legend_names(side_a, side_b)
    for comparison in comparisons:
        by_stage[comparison.stage].append(comparison)
    for stage in (*STAGE_MARKERS, *OTHER_KINDS):
        if stage not in by_stage:
            continue
        members = by_stage[stage]
        rows = []
        for comparison in members:
            short = comparison.case_id.rpartition("::")[2]
            for metric, *cells in comparison.rows:
                rows.append([short, comparison.condition, metric, *cells, comparison.notes])
        lines += [f"## {stage}", "", *table(HEADER, rows), ""]
        stage_call = next((f"; stage-wide tokens/s x{c.geomean:.3g}: {c.call}" for c in stages
                           if c.stage == stage and c.metric == METRICS[0].name
                           and c.geomean is not None), "")
        figure = _side_figure(members, f"{stage}: A vs B, shared cases{stage_call}", names)
        if figure is not None:
            written = layout.save(figure, target / PLOTS_DIR_NAME / f"{slug(stage)}-a_vs_b.png")
            if written is not None:
                relative = written.relative_to(target).as_posix()
                caption = (f"{stage}: {names[0]} vs {names[1]} per shared case "
                           "(bars: min-max over repetitions)")
                lines += [f"![{caption}]({relative})", "", f"*{caption}.*", ""]
    text = "\n".join(lines)
    path = target / COMPARE_FILE_NAME
    path.write_text(text + "\n")
    (target / COMPARE_HTML_NAME).write_text(
        markdown_to_html(text, "pytest-afd comparison", base_dir=target)
    )
    return path, [*terminal, f"written: {path} (and {COMPARE_HTML_NAME}, plots)"]
