"""The regions' figure: per series, the effect of token_balanced along the realized imbalance.

Two panels (prefill throughput ratio, TTFT p50 ratio), one point per tested
condition with its 95 % interval, coloured by its call; the ±minimum-effect
band around 1 and each boundary drawn as the span between the two tested
points it lies between (nothing between them was measured).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_afd.report import layout
from pytest_afd.study import effects

CALL_COLOURS = {effects.TOKEN_BALANCED: "C2", effects.REQUEST_BOUNDARY: "C3",
                effects.NO_DIFFERENCE: "C0", effects.UNDECIDED: "0.5"}
PANELS = (("prefill_tokens_per_s", "tokens/s: token_balanced / request_boundary"),
          ("ttft_p50", "TTFT p50: token_balanced / request_boundary"))
BAND_ALPHA = 0.12
SPAN_ALPHA = 0.18
AXIS_LABEL = "realized imbalance of request_boundary's split"


def _known(value: Any) -> bool:
    return isinstance(value, Mapping) and "ratio" in value


def draw_series(series: Mapping[str, Any], title: str):
    """The figure for one series of regions.json; None when no point has an axis value."""
    points = [p for region in series["regions"] for p in region["points"]
              if isinstance(p["realized_imbalance"], (int, float))]
    if not points:
        return None
    figure = layout.new_figure(len(PANELS), columns=len(PANELS))
    axes = layout.grid(figure, len(PANELS), columns=len(PANELS))
    for axis, (key, label) in zip(axes, PANELS, strict=True):
        axis.axhspan(1 / (1 + effects.MIN_EFFECT), 1 + effects.MIN_EFFECT, color="0.6",
                     alpha=BAND_ALPHA, label=f"±{effects.MIN_EFFECT:.0%} (no effect)")
        axis.axhline(1.0, color="0.3", linewidth=0.8)
        for index, boundary in enumerate(series["boundaries"]):
            axis.axvspan(*boundary["between"], color="C1", alpha=SPAN_ALPHA,
                         label="boundary (between tested points)" if index == 0 else None)
        for call, colour in CALL_COLOURS.items():
            chosen = [p for p in points if p["call"] == call and _known(p[key])]
            if not chosen:
                continue
            xs = [p["realized_imbalance"] for p in chosen]
            ys = [p[key]["ratio"] for p in chosen]
            errors = [[y - p[key]["low"] for y, p in zip(ys, chosen, strict=True)],
                      [p[key]["high"] - y for y, p in zip(ys, chosen, strict=True)]]
            axis.errorbar(xs, ys, yerr=errors, fmt="o", color=colour, capsize=layout.ERROR_CAPSIZE,
                          label=call)
        axis.set_xlabel(AXIS_LABEL)
        axis.set_title(layout.wrap(label, layout.TITLE_WRAP_CHARS), fontsize="small")
    figure.suptitle(layout.wrap(title, layout.TITLE_WRAP_CHARS * 2), fontsize="small")
    layout.figure_legend(figure, axes, "lower center")
    return figure


def series_title(series: Mapping[str, Any]) -> str:
    c = series["conditions"]
    chunk = "unchunked" if c["chunk_size"] is None else f"chunk {c['chunk_size']}"
    return (f"{c['stage']} · {c['stack']} · {c['routing']} · {chunk} · "
            f"{c['batch_tokens']} batch tokens")


def series_file(index: int) -> str:
    return f"regions-series{index + 1}.png"

