"""Progress lines for long measurement loops: ``case i/N``, what runs, elapsed and an estimate.

Stage suites and benchmark scripts run for minutes; without progress a person
cannot tell a slow run from a hung one. :class:`Progress` formats one line per
step and hands it to an emitter: :func:`stream_emitter` writes plain lines
(benchmark scripts), :func:`pytest_emitter` writes through pytest's terminal
reporter outside output capture (stage suites), and is None under ``-q``.

On a terminal the line is rewritten in place; elsewhere (CI logs, pipes) a
step's line is written at most every :data:`PLAIN_INTERVAL_S` seconds, and the
final line always (:class:`LiveLines`): a 25 s stage is a few lines, not 68.

The estimate is the mean time of the finished steps times the steps left,
leaving out the first step once another has finished (it pays one-time
costs); it is shown only once a step has finished.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

Emitter = Callable[[str], None]
SECONDS_PER_MINUTE = 60
SECONDS_PER_HOUR = 3600
# Quietest verbosity that still shows progress: pytest's -q sets verbose to -1.
MIN_PYTEST_VERBOSITY = 0
# Off a terminal, at most one progress line per this many seconds (the final line always).
PLAIN_INTERVAL_S = 5.0
ERASE_LINE = "\r\x1b[K"


def format_duration(seconds: float) -> str:
    """``9.4s``, ``2m05s``, ``1h02m``: short enough for one line."""
    if seconds < SECONDS_PER_MINUTE:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < SECONDS_PER_HOUR:
        return f"{whole // SECONDS_PER_MINUTE}m{whole % SECONDS_PER_MINUTE:02d}s"
    return f"{whole // SECONDS_PER_HOUR}h{(whole % SECONDS_PER_HOUR) // SECONDS_PER_MINUTE:02d}m"


def estimate_remaining(
    elapsed_s: float, done: int, total: int, first_step_s: float | None = None
) -> float | None:
    """Seconds left at the mean pace of the finished steps; None before the first.

    With ``first_step_s`` and two or more finished steps, the first is left out
    of the pace: it pays one-time costs (model build, caches, process start).
    """
    if done <= 0:
        return None
    if first_step_s is not None and done >= 2:  # noqa: PLR2004 - the first plus one more
        return (elapsed_s - first_step_s) / (done - 1) * max(total - done, 0)
    return elapsed_s / done * max(total - done, 0)


def _field_text(fields: dict[str, Any]) -> str:
    return " ".join(f"{name}={value}" for name, value in fields.items() if value is not None)


class Progress:
    """Counts steps of a known total and emits one line as each starts, one at the end.

    ``step(policy=..., workload=...)`` emits
    ``<title> case 3/12 policy=token_balanced workload=uniform elapsed 12.0s, about 36.0s left``.
    """

    def __init__(
        self,
        total: int,
        emit: Emitter | None,
        *,
        title: str = "",
        unit: str = "case",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if total < 0:
            raise ValueError(f"Progress total={total}; expected >= 0")
        self.total = total
        self.emit = emit
        self.title = title
        self.unit = unit
        self.clock = clock
        self.started = clock()
        self.current = 0
        self.first_step_s: float | None = None

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def _line(self, body: str) -> str:
        return f"{self.title} {body}".strip()

    def step(self, **fields: Any) -> str:
        """Start the next step; the estimate counts the steps finished before it."""
        finished = self.current
        self.current += 1
        elapsed = self.elapsed_s
        if finished == 1:
            self.first_step_s = elapsed
        left = estimate_remaining(elapsed, finished, self.total, self.first_step_s)
        timing = f"elapsed {format_duration(elapsed)}"
        if left is not None:
            timing += f", about {format_duration(left)} left"
        parts = [f"{self.unit} {self.current}/{self.total}", _field_text(fields), timing]
        line = self._line(" ".join(part for part in parts if part))
        if self.emit is not None:
            self.emit(line)
        return line

    def finish(self) -> str:
        elapsed = format_duration(self.elapsed_s)
        line = self._line(f"{self.current}/{self.total} {self.unit}s done in {elapsed}")
        if self.emit is not None:
            getattr(self.emit, "final", self.emit)(line)
        return line


class LiveLines:
    """An emitter that rewrites one line in place on a terminal and throttles elsewhere.

    ``rewrite`` (terminals) replaces the current line; without it each line goes
    to ``write_line`` unless one went less than ``interval_s`` ago. ``final``
    always shows its line and ends it with a newline.
    """

    def __init__(self, write_line: Emitter, rewrite: Emitter | None = None, *,
                 end_line: Callable[[], None] | None = None, interval_s: float = PLAIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.write_line = write_line
        self.rewrite = rewrite
        self.end_line = end_line
        self.interval_s = interval_s
        self.clock = clock
        self.last_written: float | None = None

    def __call__(self, line: str) -> None:
        if self.rewrite is not None:
            self.rewrite(line)
            return
        now = self.clock()
        if self.last_written is None or now - self.last_written >= self.interval_s:
            self.write_line(line)
            self.last_written = now

    def final(self, line: str) -> None:
        if self.rewrite is not None:
            self.rewrite(line)
            if self.end_line is not None:
                self.end_line()
            return
        self.write_line(line)
        self.last_written = self.clock()


def stream_emitter(stream: TextIO | None = None) -> LiveLines:
    """Lines on ``stream`` (default stderr, so a script's JSON on stdout stays clean):
    rewritten in place on a terminal, at most every few seconds otherwise."""
    target = stream if stream is not None else sys.stderr

    def write(text: str) -> None:
        target.write(text)
        target.flush()

    live = hasattr(target, "isatty") and target.isatty()
    return LiveLines(lambda line: write(line + "\n"),
                     (lambda line: write(ERASE_LINE + line)) if live else None,
                     end_line=lambda: write("\n"))


def pytest_emitter(config: Any) -> LiveLines | None:
    """Lines through pytest's terminal reporter, shown live despite output capture
    (in place on a terminal, at most every few seconds otherwise).

    None under ``-q`` and where no terminal reporter exists (pytest-xdist
    workers, ``-p no:terminal``): progress is then silent, never an error.
    """
    if config.get_verbosity() < MIN_PYTEST_VERBOSITY or hasattr(config, "workerinput"):
        return None
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return None
    capture = config.pluginmanager.get_plugin("capturemanager")

    def uncaptured(write: Callable[[], None]) -> None:
        if capture is None:
            write()
            return
        with capture.global_and_fixture_disabled():
            write()

    def rewrite(line: str) -> None:
        uncaptured(lambda: reporter.rewrite(line, erase=True))

    return LiveLines(lambda line: uncaptured(lambda: reporter.write_line(line)),
                     rewrite if getattr(reporter, "isatty", False) else None,
                     end_line=lambda: uncaptured(lambda: reporter.write("\n")))
