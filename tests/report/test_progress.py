"""Progress lines: counts, estimates, plain stream output and pytest's terminal reporter."""

import io

import pytest

from pytest_afd.run.progress import (
    ERASE_LINE,
    LiveLines,
    Progress,
    estimate_remaining,
    format_duration,
    stream_emitter,
)

pytest_plugins = ["pytester"]


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_lines_count_steps_and_estimate_from_finished_ones():
    clock, lines = FakeClock(), []
    progress = Progress(4, lines.append, title="stage_a", clock=clock)
    first = progress.step(policy="none", workload="uniform")
    assert first == "stage_a case 1/4 policy=none workload=uniform elapsed 0.0s"
    clock.now += 10.0
    second = progress.step(policy="token_balanced", workload=None)  # None fields are left out
    assert second == "stage_a case 2/4 policy=token_balanced elapsed 10.0s, about 30.0s left"
    clock.now += 110.0  # the second step took 110 s; the first (10 s) paid start-up costs
    assert progress.step().endswith("elapsed 2m00s, about 3m40s left")
    clock.now += 5.0
    progress.step()
    assert progress.finish() == "stage_a 4/4 cases done in 2m05s"
    assert lines[0] == first and len(lines) == 5


def test_no_emitter_is_silent_but_still_counts():
    progress = Progress(2, None, unit="run")
    assert progress.step(case="x").startswith("run 1/2 case=x")
    assert progress.current == 1


def test_estimate_and_durations():
    assert estimate_remaining(10.0, 0, 5) is None
    assert estimate_remaining(10.0, 2, 5) == pytest.approx(15.0)
    assert estimate_remaining(10.0, 6, 5) == 0.0  # more steps than announced: nothing left
    assert estimate_remaining(40.0, 3, 5, first_step_s=30.0) == pytest.approx(10.0)
    assert format_duration(9.44) == "9.4s"
    assert format_duration(125) == "2m05s"
    assert format_duration(3720) == "1h02m"
    with pytest.raises(ValueError, match="total=-1"):
        Progress(-1, None)


def test_stream_emitter_writes_flushed_lines():
    stream = io.StringIO()
    emit = stream_emitter(stream)
    Progress(1, emit, title="bench").step(size=512)
    assert stream.getvalue().startswith("bench case 1/1 size=512 elapsed ")
    assert stream.getvalue().endswith("\n")


PROGRESS_TEST = """
from pytest_afd.run.progress import Progress, pytest_emitter

def test_loop(request):
    progress = Progress(3, pytest_emitter(request.config), title="loop")
    for policy in ("none", "request_boundary", "token_balanced"):
        print("captured output stays captured")
        progress.step(policy=policy)
    progress.finish()
"""


def test_pytest_emitter_shows_lines_live_and_stays_quiet_under_q(pytester):
    pytester.makepyfile(test_loop=PROGRESS_TEST)
    shown = pytester.runpytest("-p", "no:cacheprovider")
    shown.assert_outcomes(passed=1)
    # Not a terminal: the first line, then at most one per 5 s, and the final line.
    shown.stdout.fnmatch_lines(["*loop case 1/3 policy=none elapsed*", "*loop 3/3 cases done in*"])
    assert "loop case 2/3" not in shown.stdout.str()
    assert "captured output stays captured" not in shown.stdout.str()
    quiet = pytester.runpytest("-p", "no:cacheprovider", "-q")
    quiet.assert_outcomes(passed=1)
    assert "loop case" not in quiet.stdout.str()


def test_off_a_terminal_lines_come_at_most_every_few_seconds():
    clock, lines = FakeClock(), []
    live = LiveLines(lines.append, clock=clock)
    progress = Progress(68, live, title="stage_d", unit="run", clock=clock)
    for _ in range(68):  # a 25 s stage: one run every 0.37 s
        progress.step()
        clock.now += 25 / 68
    progress.finish()
    assert len(lines) == 6  # t = 0, 5.1, 10.3, 15.4, 20.6 and the final line
    assert lines[-1] == "stage_d 68/68 runs done in 25.0s"


def test_on_a_terminal_the_line_is_rewritten_in_place():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    progress = Progress(3, stream_emitter(stream), title="bench")
    for _ in range(3):
        progress.step()
    progress.finish()
    text = stream.getvalue()
    assert text.count("\n") == 1 and text.endswith("bench 3/3 cases done in 0.0s\n")
    assert text.count(ERASE_LINE) == 4
