"""``--afd-reference-phase``: gate references recorded from one deployment, checked on another.

A deployment's split policy, chunking and prefix caching are fixed when it
starts, so on an attached cluster deployment a gate cannot run its candidate
and its reference side by side. The reference phase runs each gate's
reference (unsplit, uncached, unchunked) and records its outputs in the golden
store; a later candidate phase, against the deployment under test, runs only
the candidate and compares it with the recorded reference. ``live`` (the
default) runs both in one session, as on the CPU backend. See docs/gates.md.
"""

from __future__ import annotations

import os

import pytest

PHASE_LIVE = "live"
PHASE_RECORD = "record"
PHASE_CHECK = "check"
PHASES = (PHASE_LIVE, PHASE_RECORD, PHASE_CHECK)
FLAG = "--afd-reference-phase"
DEST = "afd_reference_phase"
ENV = "AFD_REFERENCE_PHASE"
HELP = (f"gate references: {PHASE_LIVE} (run them in this session), {PHASE_RECORD} (run only "
        f"the unsplit/uncached/unchunked references and store them as goldens), {PHASE_CHECK} "
        f"(run only the candidates and compare with the stored references) [env {ENV}]")


def add_option(group: pytest.OptionGroup, parser: pytest.Parser) -> None:
    group.addoption(FLAG, dest=DEST, default=None, choices=PHASES, help=HELP)
    parser.addini(DEST, HELP, default=None)


def reference_phase(config: pytest.Config) -> str:
    """CLI > environment > ini > ``live``; a bad value names where it came from."""
    value = config.getoption(DEST)
    if value is not None:
        return value
    for text, source in ((os.environ.get(ENV, ""), f"${ENV}"),
                         (config.getini(DEST) or "", f"ini {DEST}")):
        text = text.strip()
        if text:
            if text not in PHASES:
                raise pytest.UsageError(f"{source}={text!r}: expected one of {', '.join(PHASES)}")
            return text
    return PHASE_LIVE
