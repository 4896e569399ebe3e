"""``--afd-study FILE`` inside a pytest session: record the study, refuse contradicting runs.

Registered by :func:`pytest_afd.plugin.pytest_configure` when a study is given.
Every manifest the session builds (the session's, and a stage pool's for another
model depth or topology) passes through :meth:`StudyPlugin.pytest_afd_manifest`:
it gets ``study: {name, digest}``, and when it contradicts the study the case
fails there, naming each field with the study's and the run's value. A case
that needs the backend is checked before its body runs, so it fails before it measures.
Gates are checked on the stack and tolerances only (``check.SCOPE_STACK``).

One field can be unknown before a case measures: in deploy-command mode the layer count
when the checkpoint is not readable here (the deployment reports it once the first case
has started it, ``check.served_later``). That field is left to the written result: each
result's manifest is checked again when it is written, and a contradiction fails the case
there, naming the field (publish and select-references exclude such a result too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from pytest_afd.backends import BackendUnavailable
from pytest_afd.study.check import (
    SCOPE_ALL,
    SCOPE_STACK,
    contradiction_message,
    contradictions,
    served_later,
)

PLUGIN_NAME = "afd-study"
STUDY_KEY = "study"
# Cases that run on the backend: checked in setup, before their body measures anything.
BACKEND_FIXTURES = frozenset(("afd_backend", "afd_manifest", "afd_results", "stage_runner",
                              "backend_pool", "golden"))


GATE_MARKER = "gate"


class StudyPlugin:
    def __init__(self, study: Mapping[str, Any]) -> None:
        self.study = study
        # The running item's check scope: gates are checked on the stack and tolerances only.
        self.scope = SCOPE_ALL

    def record(self) -> dict[str, str]:
        return {"name": self.study["name"], "digest": self.study["digest"]}

    def _before_measuring(self, manifest: Mapping[str, Any]) -> list[Any]:
        """The contradictions a case can be refused for before it measures."""
        found = contradictions(self.study, manifest, scope=self.scope)
        return [item for item in found if not served_later(item)]

    @pytest.hookimpl(trylast=True)  # after every other plugin added its facts
    def pytest_afd_manifest(self, config: pytest.Config, manifest: dict[str, Any]) -> None:
        found = self._before_measuring(manifest)
        if found:
            pytest.fail(contradiction_message(self.study, found), pytrace=False)
        manifest[STUDY_KEY] = self.record()

    @pytest.hookimpl(tryfirst=True)  # before any fixture of the item builds a manifest
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.scope = SCOPE_STACK if item.get_closest_marker(GATE_MARKER) else SCOPE_ALL

    @pytest.hookimpl(tryfirst=True)  # raising here, the test body never runs
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        """Before the test body: the session manifest checked at this item's scope.

        Checked here, not only when the manifest is built: it is built once per
        session, possibly for a gate (stack scope) before a stage case (full scope).
        """
        from pytest_afd.run.session import afd_session  # the plugin's state, made at configure

        if BACKEND_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
            return
        state = afd_session(item.config)
        try:
            state.backend()
        except BackendUnavailable:
            return  # the afd_backend fixture skipped (or stopped the session) with the reason
        found = self._before_measuring(state.manifest())
        if found:
            pytest.fail(contradiction_message(self.study, found), pytrace=False)

    def pytest_afd_result_written(self, config: pytest.Config, path: Any,
                                  result: Mapping[str, Any]) -> None:
        """The written result's manifest (with what its deployment reported) against the study."""
        found = contradictions(self.study, result["manifest"], scope=self.scope)
        if found:
            pytest.fail(f"{result['case_id']} ({path}): "
                        + contradiction_message(self.study, found), pytrace=False)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return [f"afd: study {self.study['name']!r} {self.study['digest']}"]
