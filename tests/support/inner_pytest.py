"""Command-line flags for pytest runs that a test starts in a new process.

Every fresh pytest process (a subprocess, a fork-server child, each xdist worker of an
inner ``-n`` run) loads the third-party plugins hypothesis, anyio and pytest-benchmark
through their entry points, and with ``PYTHONDONTWRITEBYTECODE=1`` (set on the dev host
and in CI) pytest rewrites their asserts again every time: ~1.3-1.8 s of CPU per
process here. Inner runs whose subject is none of those plugins leave them out.
"""

from __future__ import annotations

UNRELATED_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:anyio", "-p", "no:benchmark")
"""``-p no:<entry point>`` for hypothesis, anyio and pytest-benchmark (pytest11 names)."""
