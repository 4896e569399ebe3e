"""Absent timings are absent records with their reason, never an empty table."""

from pytest_afd.backends.cpu.run_evidence import timings_document
from pytest_afd.core.backend import RunOutputs
from pytest_afd.results.documents import is_absent
from pytest_afd.results.parts import EMPTY_TIMINGS_REASON, evidence_from_outputs, timings_or_absent


def test_an_empty_timings_document_is_an_absent_record():
    empty = timings_document([])  # what a CPU run that timed no layer hands back
    assert empty["layers"] == [] and empty["ubatches"] == []
    recorded = timings_or_absent(empty, "unused")
    assert is_absent(recorded) and recorded["absent_reason"] == EMPTY_TIMINGS_REASON
    evidence = evidence_from_outputs(RunOutputs(requests=[], timings=empty), routing="natural",
                                     num_ep_ranks=1)
    assert evidence["per_layer_timings"] == recorded


def test_no_timings_give_the_callers_reason_and_real_timings_stay():
    assert timings_or_absent(None, "not instrumented")["absent_reason"] == "not instrumented"
    timed = timings_document([[{"attention": 0.1}]])
    assert timings_or_absent(timed, "unused") is timed
