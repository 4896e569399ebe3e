"""Stage A directory fixtures: ``make_runner``, a stage runner on the scripted backend."""

from __future__ import annotations

import dataclasses

import pytest
from scripted_backend import CollectingWriter, ScriptedBackend


@pytest.fixture
def make_runner(stage_helpers, afd_options, afd_manifest, npu_topology):
    def make(capabilities, report_steps=True, **option_changes):
        backend = ScriptedBackend(capabilities, report_steps)
        options = dataclasses.replace(
            afd_options,
            **{"warmups": 1, "repeats": 3, "run_order": "interleaved", "profile": False}
            | option_changes,
        )
        handle = stage_helpers.BackendHandle(backend, afd_manifest, npu_topology, "reduced")
        runner = stage_helpers.StageRunner(
            handle=handle,
            options=options,
            writer=CollectingWriter(),
            sizes=stage_helpers.StageSizes(1 / 64),
            pool=None,
        )
        return runner, backend

    return make
