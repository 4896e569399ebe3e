"""The whole study on CPU, end to end (slow; nightly): freeze, gates, Stage A in two sessions,
reference selection, stages B-E under the referenced study, Stage D again with the frozen best
two chunk sizes, Stage F, and publish (docs/study.md), on the CPU backend in-process.

The steps are the shared sequence of study_sequence.py (the commands a person runs, each in
its own process). The checks are on what the steps wrote: every case records the study it
ran under, stages B-E ran the reference configuration, Stage D's follow-ups ran the study's
sizes, and the bundle's regions agree with its own tables. The same sequence through the CPU
deploy command is test_study_deploy_command.py.
"""

from __future__ import annotations

import pytest

from tests.study.study_sequence import (
    StudyRun,
    base_env,
    check_bundle,
    check_stage_d_sizes,
    check_stages_b_e,
)

pytestmark = pytest.mark.slow

def test_study_end_to_end_on_cpu(tmp_path):
    sequence = StudyRun(tmp_path, base_env(tmp_path, AFD_BACKEND="cpu"))
    run = sequence.whole("cpu-rehearsal")
    assert set(run["frozen"]["launch_commands"]) == {"attention.node0", "attention.node1", "ffn",
                                                     "baseline.node0", "baseline.node1"}
    check_stages_b_e(run)
    check_stage_d_sizes(run)
    check_bundle(run)
