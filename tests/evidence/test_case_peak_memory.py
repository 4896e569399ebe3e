"""Each case reports its own peak memory (not the process's high-water mark), or why not."""

from __future__ import annotations

import pytest

from pytest_afd.backends import create_backend
from pytest_afd.backends.cpu.memory import AFD_PROCESSES_REASON, case_peak_bytes, tensors_bytes
from pytest_afd.core.backend import PromptRequest, RunOutputs, RunSettings
from pytest_afd.results import documents as results
from pytest_afd.topology.spec import parse_topology

PROMPTS = [PromptRequest("a", tuple(range(1, 41)))]
SETTINGS = RunSettings(block_size=16, split_align=1, pcp_size=1)


@pytest.fixture(scope="module")
def peaks(tmp_path_factory):
    out = {}
    topology = parse_topology("dp3pcp8-ep8")
    made = []
    try:
        for name in ("reduced", "full"):  # both alive at once: one process, two models
            backend = create_backend("cpu", topology=topology, model_name=name, seed=0,
                                     results_dir=tmp_path_factory.mktemp(name))
            made.append(backend)
        for backend in made:
            run = backend.run(PROMPTS, SETTINGS)
            out[backend.describe()["model"]["num_layers"]] = (
                run.peak_memory_bytes, tensors_bytes(backend.model.weights.values())
            )
    finally:
        for backend in made:
            backend.close()
    return out


def test_61_and_10_layer_cases_report_different_peaks(peaks):
    (reduced, reduced_weights), (full, full_weights) = peaks[10], peaks[61]
    assert reduced is not None and full is not None
    assert full != reduced and full > reduced
    assert reduced >= reduced_weights and full >= full_weights
    # The full model's weights are not counted in the reduced case (both were resident).
    assert reduced < full_weights


def test_case_peak_arithmetic():
    assert case_peak_bytes(1_000, 600, 50) == 450
    assert case_peak_bytes(500, 600, 50) == 50  # the run shrank the process: no transient
    assert case_peak_bytes(None, 600, 50) is None


def test_afd_process_runs_say_why_peak_is_absent():
    run = RunOutputs(requests=[], peak_memory_absent_reason=AFD_PROCESSES_REASON)
    doc = results.reported_peak_memory([run])
    assert doc == {"value": None, "absent_reason": AFD_PROCESSES_REASON}
