"""One side of a comparison: a results directory, optionally one session or one stack."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_afd.report.loading import LoadedResult, load_results
from pytest_afd.report.rendering import ReportError
from pytest_afd.report.tables import short_digest


@dataclass(frozen=True)
class Side:
    """One selection of results: a directory, optionally one session or one stack."""

    results_dir: Path
    session: str | None = None
    stack: str | None = None
    all_sessions: bool = False

    @property
    def name(self) -> str:
        text = str(self.results_dir)
        if self.session:
            text += f" session {self.session}"
        if self.stack:
            text += f" stack {self.stack}"
        return text

    def load(self) -> dict[str, LoadedResult]:
        """case id -> result (the newest when the selection holds several)."""
        if not self.results_dir.is_dir():
            raise FileNotFoundError(f"results directory {str(self.results_dir)!r} does not exist")
        chosen = load_results(
            self.results_dir,
            session=self.session,
            latest_only=self.session is None and not self.all_sessions,
        ).results
        if self.stack is not None:
            wanted = self.stack.removeprefix("sha256:")
            chosen = [r for r in chosen if short_digest(r.stack).startswith(wanted[:12])]
        if not chosen:
            raise ReportError(f"{self.name}: no results match this selection")
        newest: dict[str, LoadedResult] = {}
        for result in sorted(chosen, key=lambda r: r.doc["created_at"]):
            newest[result.case_id] = result
        return newest


def legend_names(side_a: Side, side_b: Side) -> tuple[str, str]:
    """``A: <dir>`` / ``B: <dir>``; the whole selection when both directories share a name."""
    left, right = side_a.results_dir.name, side_b.results_dir.name
    if left == right or not left or not right:
        left, right = side_a.name, side_b.name
    return f"A: {left}", f"B: {right}"
