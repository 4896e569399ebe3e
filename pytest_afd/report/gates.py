"""The gates' own section: per gate case, the logit error against its tolerance.

Gates are correctness checks, not performance cases: they get one table
(verdict, tolerance profile, max abs / rel logit error, atol / rtol, error over
atol, invariant violations, greedy-token mismatches) and one figure of error
over tolerance per case, never the per-stack performance plots.
``evidence.gate.verdict`` is what suites/gates/gate_lib.py's GateVerdict writes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from pytest_afd.golden.store import PROFILES
from pytest_afd.report import layout
from pytest_afd.report.loading import LoadedResult, verdict_rank
from pytest_afd.report.tables import EMPTY, fmt, table, verdict_text

GATE_KEY = "gate"
VERDICT_KEY = "verdict"
# Most gate cases drawn in the figure (the table lists every one).
MAX_PLOTTED_GATES = 60
BAR_HEIGHT_IN = 0.22
BIT_IDENTICAL = "0 (bit-identical)"
HEADER = (
    "case",
    "gate",
    "verdict",
    "tolerance",
    "max abs logit error",
    "atol",
    "error / atol",
    "max rel error",
    "rtol",
    "invariant violations",
    "token mismatches",
)


def gate_verdict(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    gate = doc["evidence"].get(GATE_KEY)
    if not isinstance(gate, Mapping) or not isinstance(gate.get(VERDICT_KEY), Mapping):
        return None
    return gate[VERDICT_KEY]


def tolerance(verdict: Mapping[str, Any]) -> tuple[str, float | None, float | None]:
    """(profile name, atol, rtol) from the recorded profile description."""
    name = str(verdict["tolerance_profile"]).split(" ")[0]
    profile = PROFILES.get(name)
    if profile is None or profile.kind != "close":
        return name, None, None
    return name, profile.atol, profile.rtol


def error_over_atol(verdict: Mapping[str, Any]) -> float | None:
    _, atol, _ = tolerance(verdict)
    error = verdict["max_abs_error"]
    if error is None or not atol:
        return None
    return float(error) / atol


def bit_identical(verdict: Mapping[str, Any]) -> bool:
    """Exactly zero error: the split reproduced the reference bit for bit (no bar to draw)."""
    return verdict["max_abs_error"] == 0 and verdict["max_rel_error"] in (0, None)


def _row(result: LoadedResult) -> list[str]:
    gate = result.doc["evidence"].get(GATE_KEY)
    number = str(gate.get("gate", EMPTY)) if isinstance(gate, Mapping) else EMPTY
    verdict = gate_verdict(result.doc)
    if verdict is None:
        return [result.case_id, number, verdict_text(result), "no logits compared",
                *([EMPTY] * (len(HEADER) - 4))]
    _, atol, rtol = tolerance(verdict)
    identical = bit_identical(verdict)
    return [
        result.case_id,
        number,
        verdict_text(result),
        str(verdict["tolerance_profile"]),
        BIT_IDENTICAL if identical else fmt(verdict["max_abs_error"]),
        fmt(atol),
        BIT_IDENTICAL if identical else fmt(error_over_atol(verdict)),
        fmt(verdict["max_rel_error"]),
        fmt(rtol),
        str(len(verdict["invariant_violations"])),
        str(len(verdict["greedy_token_mismatches"])),
    ]


def gates_section(results: Sequence[LoadedResult], *, draw: bool = True
                  ) -> tuple[list[str], Figure | None]:
    """Markdown lines of the gates table, and the error-over-tolerance figure (None when
    there is nothing to draw, or ``draw`` is off: ``report --no-plots``)."""
    ordered = sorted(results, key=lambda r: (verdict_rank(r), r.case_id))
    identical = sum(1 for r in results if (v := gate_verdict(r.doc)) is not None
                    and bit_identical(v))
    lines = [
        f"{len(results)} gate case(s). A gate passes when every logit is within its profile's "
        "tolerance (|error| <= atol + rtol x |reference|) and no split invariant is violated; "
        "error / atol above 1 needs the rtol share of the reference to pass. "
        f"{identical} case(s) are bit-identical to their reference (error exactly 0): "
        "the table says so, the figure draws only cases with an error.",
        "",
        *table(HEADER, [_row(r) for r in ordered]),
        "",
    ]
    return lines, draw_gate_errors(ordered) if draw else None


def draw_gate_errors(results: Sequence[LoadedResult]) -> Figure | None:
    """Horizontal bars of max abs logit error / atol per gate case, the tolerance line at 1."""
    rows = [(r, error_over_atol(v)) for r in results
            if (v := gate_verdict(r.doc)) is not None and not bit_identical(v)]
    rows = [(r, ratio) for r, ratio in rows if ratio is not None]
    total = len(rows)
    rows = rows[:MAX_PLOTTED_GATES]
    if not rows:
        return None
    labels = [layout.wrap(r.case_id.rpartition("::")[2] or r.case_id, 48) for r, _ in rows]
    slot = max(BAR_HEIGHT_IN, max(map(layout.line_count, labels)) * layout.LINE_HEIGHT_IN)
    figure = Figure(figsize=(layout.PANEL_WIDTH_IN * 2, len(rows) * slot + layout.FRAME_HEIGHT_IN),
                    dpi=layout.FIGURE_DPI, layout="constrained")
    axis = figure.add_subplot(1, 1, 1)
    colors = ["C3" if r.status in ("failed", "error") else "C0" for r, _ in rows]
    # A zero error cannot sit on a log axis: it is drawn at the axis' floor.
    floor = min([ratio for _, ratio in rows if ratio > 0], default=1.0) / 10
    axis.barh(range(len(rows)), [max(ratio, floor) for _, ratio in rows], color=colors,
              label="max abs logit error / atol (red: failed)")
    axis.axvline(1.0, color="grey", linestyle="--", gid=layout.REFERENCE_GID, label="atol")
    axis.set_xscale("log")
    axis.set_yticks(range(len(rows)))
    axis.set_yticklabels(labels, fontsize="small")
    axis.set_ylim(len(rows) - 0.5, -0.5)
    zeros = [index for index, (_, ratio) in enumerate(rows) if ratio == 0]
    for index in zeros:  # a zero abs error with a rel error: at the floor, said so
        axis.annotate("abs error 0", (floor, index), xytext=(4, 0),
                      textcoords="offset points", va="center", fontsize="x-small")
    axis.set_xlabel("max abs logit error / atol (log)")
    shown = f"{len(rows)} of {total} case(s) (failed first; the table lists all)"
    floor_note = f"; {len(zeros)} with zero error drawn at the floor" if zeros else ""
    axis.set_title(f"gate logit error against tolerance\n{shown}{floor_note}", fontsize="small")
    layout.figure_legend(figure, [axis])
    return figure
