"""Render a results directory into a Markdown + HTML report with PNG plots.

``pytest-afd report RESULTS_DIR`` (or :func:`render`) and
``pytest-afd compare A B`` (or :func:`pytest_afd.report.compare.compare`).
The package is split by job: ``scan`` (file facts, cached by identity),
``loading`` (sessions, verdicts), ``values`` (reading result documents),
``tables`` (Markdown), ``layout``, ``plots``, ``point_plots`` and
``sidebyside`` (figures), ``gates`` (the gates section), ``rendering`` (one
directory), ``compare``, ``selection`` and ``noise`` (two selections, host
conditions, A/A calibrations) and ``html`` (the self-contained page). See
docs/report.md.
"""

from pytest_afd.report.loading import LoadedResult, LoadedResults, load_results
from pytest_afd.report.rendering import ReportError, render, render_markdown
from pytest_afd.report.tables import short_digest
from pytest_afd.report.values import (
    condition_labels,
    layer_breakdown_from_tables,
    per_layer_rank_skew,
    rank_skew,
    stack_description,
    step_time_s,
)

__all__ = [
    "LoadedResult",
    "LoadedResults",
    "ReportError",
    "condition_labels",
    "layer_breakdown_from_tables",
    "load_results",
    "per_layer_rank_skew",
    "rank_skew",
    "render",
    "render_markdown",
    "short_digest",
    "stack_description",
    "step_time_s",
]
