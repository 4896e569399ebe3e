"""Stage D's verdict line says whose follow-up chunk sizes ran: the sweep's or the study's."""

from pytest_afd.stats.verdicts import SWEEP_SOURCE, stage_conclusion
from pytest_afd.workloads import make_workload
from tests.support.report_builders import SMALL, make_result, stamped


def _doc(source):
    doc = make_result("suites/stage_d/t.py::t/best/uniform-fixed/chunk512", "stage_d",
                      make_workload("uniform", **SMALL), "token_balanced", wall_s=1.0,
                      chunk_size=512)
    doc["evidence"]["stage_d_best_sizes"] = [1024, 512]
    if source is not None:
        doc["evidence"]["stage_d_best_sizes_source"] = source
    return stamped(doc, "passed", session="s1", created_at="2026-12-07T12:00:00+00:00")


def test_stage_d_verdict_names_the_source_of_the_follow_up_sizes():
    assert "(the fastest chunked sizes of the sweep; not a verdict)" in stage_conclusion(
        [_doc(None)])
    assert "(the fastest chunked sizes of the sweep; not a verdict)" in stage_conclusion(
        [_doc(SWEEP_SOURCE)])
    line = stage_conclusion([_doc("the study s sha256:ab")])
    assert "follow-ups ran chunk sizes 1024, 512 (frozen in the study s sha256:ab; not a " \
           "verdict)" in line
